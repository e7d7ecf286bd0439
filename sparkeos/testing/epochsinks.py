"""Sinks for tests and models of real-time mode: an ``EpochParticipant`` as a sink."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sparkeos.core.protocol import EpochParticipant, Transaction, TransactionalSink


class NoMicroBatchSink(TransactionalSink[Any]):
    """A sink whose micro-batch hooks are never called (none is written per batch)."""

    def begin(self, txn: Transaction) -> Any:
        raise NotImplementedError("a sink of real-time tests only")

    def write(self, handle: Any, batch: pa.RecordBatch) -> None:
        raise NotImplementedError("a sink of real-time tests only")

    def prepare(self, handle: Any) -> dict[str, Any]:
        raise NotImplementedError("a sink of real-time tests only")

    def commit(self, txn: Transaction, receipt: dict[str, Any]) -> None:
        raise NotImplementedError("a sink of real-time tests only")

    def rollback(self, txn: Transaction) -> None:
        raise NotImplementedError("a sink of real-time tests only")


class EpochOnlySink(NoMicroBatchSink):
    """``participant`` as the sink's ``epoch_participant``."""

    def __init__(self, participant: EpochParticipant[Any]) -> None:
        self.participant = participant

    def epoch_participant(self) -> EpochParticipant[Any]:
        return self.participant


__all__ = ["EpochOnlySink", "NoMicroBatchSink"]
