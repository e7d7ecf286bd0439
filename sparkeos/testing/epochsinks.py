"""For tests and models of real-time mode: an ``EpochParticipant`` as a sink, and the
parts of Spark's ``TaskContext`` the writer reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkeos.core.protocol import EpochParticipant, Transaction, TransactionalSink
from sparkeos.core.streaming.realtime import RUN_ID_PROPERTY


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


@dataclass(frozen=True)
class TaskContextOf:
    """A task of the query run ``run`` (empty: a task without Spark's run ID), Spark's
    task attempt ID ``task_id``."""

    run: str
    task_id: int

    def getLocalProperty(self, key: str) -> str | None:
        return self.run if key == RUN_ID_PROPERTY else None

    def taskAttemptId(self) -> int:
        return self.task_id

    def attemptNumber(self) -> int:
        return 0


__all__ = ["EpochOnlySink", "NoMicroBatchSink", "TaskContextOf"]
