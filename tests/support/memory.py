"""An in-memory participant and batch runner for unit tests of the core protocol.

``MemorySystem`` behaves like a database with prepared transactions: writes are
invisible until commit, a prepared transaction survives the writer, a new ``begin`` of
an ID fences the earlier attempt, and it keeps a marker per committed transaction so
an idempotent commit can tell "already committed" from "lost".
"""

from __future__ import annotations

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
from sparkeos.testing.inprocess import ListRunner, MemoryStore, id_batch


@dataclass
class MemorySystem:
    visible: list[Any] = field(default_factory=list)
    prepared: dict[str, list[Any]] = field(default_factory=dict)
    open: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    fenced: set[tuple[str, str]] = field(default_factory=set)
    markers: set[tuple[str, int]] = field(default_factory=set)
    commits: int = 0


@dataclass
class Handle:
    key: tuple[str, str]
    txn: Transaction


class MemorySink(TransactionalSink[Handle]):
    """Commits on the driver (CommitLocation.DRIVER)."""

    def __init__(self, system: MemorySystem) -> None:
        self.system = system

    def _fence(self, txn_id: str, keep: tuple[str, str] | None = None) -> None:
        for key in list(self.system.open):
            if key[0] == txn_id and key != keep:
                self.system.fenced.add(key)
                del self.system.open[key]

    def begin(self, txn: Transaction) -> Handle:
        key = (txn.txn_id, f"{txn.batch_id}:{txn.attempt}")
        self.system.prepared.pop(txn.txn_id, None)
        self._fence(txn.txn_id, keep=key)
        self.system.open[key] = []
        return Handle(key, txn)

    def write(self, handle: Handle, batch: pa.RecordBatch) -> None:
        if handle.key in self.system.fenced:
            raise RuntimeError(f"transaction {handle.key} was fenced")
        self.system.open[handle.key].extend(batch.column("id").to_pylist())

    def prepare(self, handle: Handle) -> Receipt:
        if handle.key in self.system.fenced:
            raise RuntimeError(f"transaction {handle.key} was fenced")
        rows = self.system.open.pop(handle.key)
        self.system.prepared[handle.key[0]] = rows
        return {"rows": len(rows)}

    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        marker = (txn.txn_id, txn.batch_id)
        rows = self.system.prepared.pop(txn.txn_id, None)
        if rows is None:
            if marker in self.system.markers:
                return
            raise DataLossError("prepared transaction vanished", txn_id=txn.txn_id,
                                batch_id=txn.batch_id)
        self.system.visible.extend(rows)
        self.system.markers.add(marker)
        self.system.commits += 1

    def rollback(self, txn: Transaction) -> None:
        self.system.prepared.pop(txn.txn_id, None)
        self._fence(txn.txn_id)

    def probe(self, txn: Transaction) -> TxnState:
        if txn.txn_id in self.system.prepared:
            return TxnState.PREPARED
        if (txn.txn_id, txn.batch_id) in self.system.markers:
            return TxnState.COMMITTED
        return TxnState.ABSENT


__all__ = [
    "Handle",
    "ListRunner",
    "MemorySink",
    "MemoryStore",
    "MemorySystem",
    "TaskCommitMemorySink",
    "id_batch",
]


class TaskCommitMemorySink(MemorySink):
    """The same system, committed from Spark tasks (CommitLocation.TASKS)."""

    commit_location = CommitLocation.TASKS
