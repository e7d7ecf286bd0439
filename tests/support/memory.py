"""An in-memory participant and batch runner for unit tests of the core protocol.

``MemorySystem`` behaves like a database with prepared transactions: writes are
invisible until commit, a prepared transaction survives the writer, every attempt has
its own transaction ID, a rolled-back open transaction is fenced (its writer fails),
and a marker per committed transaction of a (batch, partition), with the rows it wrote,
lets an idempotent commit tell "already committed" from "lost" and a replay skip a
partition only when it holds the rows committed there (``core.snapshot.replay``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import DataLossError
from sparkeos.core.protocol import (
    CommitLocation,
    Receipt,
    Transaction,
    TransactionalSink,
    TxnState,
)
from sparkeos.core.snapshot.fingerprint import Written, fingerprint_of
from sparkeos.core.snapshot.replay import OnRecord, replay
from sparkeos.testing.inprocess import ListRunner, MemoryStore, id_batch


def written_of(rows: list[Any] | tuple[Any, ...]) -> Written:
    return fingerprint_of(id_batch(list(rows)))


@dataclass
class MemorySystem:
    visible: list[Any] = field(default_factory=list)
    prepared: dict[str, list[Any]] = field(default_factory=dict)
    open: dict[str, list[Any]] = field(default_factory=dict)
    fenced: set[str] = field(default_factory=set)
    markers: dict[tuple[int, int], str] = field(default_factory=dict)
    """(batch, partition) -> the transaction that committed it last."""
    committed_rows: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    """Transaction ID -> the rows it committed."""
    commits: int = 0
    merged: list[tuple[int, ...]] = field(default_factory=list)
    """The partitions of each merged commit (``MergingMemorySink``)."""

    @property
    def leftovers(self) -> list[str]:
        return sorted([*self.open, *self.prepared])


@dataclass
class Handle:
    txn: Transaction
    skipped: bool = False


class MemorySink(TransactionalSink[Handle]):
    """Commits on the driver (CommitLocation.DRIVER)."""

    def __init__(self, system: MemorySystem) -> None:
        self.system = system

    def begin(self, txn: Transaction) -> Handle:
        if txn.txn_id in self.system.open or txn.txn_id in self.system.prepared:
            raise RuntimeError(f"transaction ID {txn.txn_id} is already in use")
        self.system.open[txn.txn_id] = []
        return Handle(txn)

    def _check(self, handle: Handle) -> None:
        if handle.txn.txn_id in self.system.fenced:
            raise RuntimeError(f"transaction {handle.txn.txn_id} was fenced")

    def write(self, handle: Handle, batch: pa.RecordBatch) -> None:
        self._check(handle)
        self.system.open[handle.txn.txn_id].extend(batch.column("id").to_pylist())

    def prepare(self, handle: Handle) -> Receipt:
        self._check(handle)
        txn = handle.txn
        rows = self.system.open.pop(txn.txn_id)
        earlier = [written_of(self.system.committed_rows[t]) for t in self._committed(txn)]
        met = replay(txn, written_of(rows), OnRecord.of_batch(txn.batch_id, earlier))
        if met.skip:  # the same rows committed there before: a replay
            handle.skipped = True
            return {"rows": 0, "skipped": True, **met.receipt_fields()}
        self.system.prepared[txn.txn_id] = rows
        return {"rows": len(rows), **met.receipt_fields()}

    def _committed(self, txn: Transaction) -> list[str]:
        return [t for t in self.system.committed_rows if self._same_partition(t, txn)]

    @staticmethod
    def _same_partition(txn_id: str, txn: Transaction) -> bool:
        return txn_id.startswith(f"{txn.participant_id}-b{txn.batch_id}r")

    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        if receipt.get("skipped"):
            return
        marker = (txn.batch_id, txn.partition)
        rows = self.system.prepared.pop(txn.txn_id, None)
        if rows is None:
            if txn.txn_id in self.system.committed_rows:
                return
            raise DataLossError("prepared transaction vanished", txn_id=txn.txn_id,
                                batch_id=txn.batch_id)
        self.system.visible.extend(rows)
        self.system.markers[marker] = txn.txn_id
        self.system.committed_rows[txn.txn_id] = tuple(rows)
        self.system.commits += 1

    def rollback(self, txn: Transaction) -> None:
        if self.system.open.pop(txn.txn_id, None) is not None:
            self.system.fenced.add(txn.txn_id)
        self.system.prepared.pop(txn.txn_id, None)

    def probe(self, txn: Transaction) -> TxnState:
        if txn.txn_id in self.system.prepared:
            return TxnState.PREPARED
        if txn.txn_id in self.system.open:
            return TxnState.OPEN
        if txn.txn_id in self.system.committed_rows:
            return TxnState.COMMITTED
        return TxnState.ABSENT


__all__ = [
    "Handle",
    "ListRunner",
    "MemorySink",
    "MemoryStore",
    "MemorySystem",
    "MergingMemorySink",
    "TaskCommitMemorySink",
    "id_batch",
]


class TaskCommitMemorySink(MemorySink):
    """The same system, committed from Spark tasks (CommitLocation.TASKS)."""

    commit_location = CommitLocation.TASKS


class MergingMemorySink(MemorySink):
    """The same system, whose commits of several participants can be one
    (``merges_commits``): every item becomes visible at once or none does, and
    ``system.merged`` records the partitions of each merged commit."""

    def merges_commits(self) -> bool:
        return True

    def commit_merged(self, items: Sequence[tuple[Transaction, Receipt]], *,
                      recovering: bool) -> None:
        for txn, receipt in items:
            if (not receipt.get("skipped") and txn.txn_id not in self.system.prepared
                    and txn.txn_id not in self.system.committed_rows):
                raise DataLossError("prepared transaction vanished", txn_id=txn.txn_id,
                                    batch_id=txn.batch_id)
        for txn, receipt in items:
            self.commit(txn, receipt)
        self.system.merged.append(tuple(txn.partition for txn, _r in items))


class TaskCommitMergingMemorySink(MergingMemorySink):
    """``MergingMemorySink`` committed from Spark tasks (CommitLocation.TASKS)."""

    commit_location = CommitLocation.TASKS
