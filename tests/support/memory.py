"""An in-memory participant and batch runner for unit tests of the core protocol.

``MemorySystem`` behaves like a database with prepared transactions: writes are
invisible until commit, a prepared transaction survives the writer, a new ``begin`` of
an ID fences the earlier attempt, and it keeps a marker per committed transaction so
an idempotent commit can tell "already committed" from "lost".
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from sparkeos.core.commitlog import Store
from sparkeos.core.coordinator import TaskFunction, TaskResult
from sparkeos.core.errors import DataLossError
from sparkeos.core.faults import InjectedTaskFailure
from sparkeos.core.protocol import Receipt, Transaction, TransactionalSink, TxnState


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


class MemoryStore(Store):
    def __init__(self) -> None:
        self.location = "memory://"
        self.files: dict[str, bytes] = {}

    def list_names(self) -> list[str]:
        return list(self.files)

    def read(self, name: str) -> bytes:
        return self.files[name]

    def write_new(self, name: str, data: bytes) -> None:
        assert name not in self.files, name
        self.files[name] = data

    def replace(self, name: str, data: bytes) -> None:
        self.files[name] = data

    def delete(self, name: str) -> None:
        self.files.pop(name, None)


def id_batch(ids: Sequence[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": pa.array(list(ids), pa.int64())})


_RUNS = itertools.count()


class ListRunner:
    """Runs tasks in-process over partitions given as lists of ids; retries like Spark."""

    def __init__(self, partitions: list[list[int]], max_attempts: int = 2) -> None:
        self.run = next(_RUNS)  # like Spark's application ID: unique per driver run
        self.data = partitions
        self.max_attempts = max_attempts
        self.schema = pa.schema([("id", pa.int64())])

    def partitions(self) -> int:
        return len(self.data)

    def arrow_schema(self) -> pa.Schema:
        return self.schema

    def run_tasks(self, task: TaskFunction) -> list[TaskResult]:
        results = []
        for p, ids in enumerate(self.data):
            for attempt in range(self.max_attempts):
                batches: Iterator[pa.RecordBatch] = iter([id_batch(ids)] if ids else [])
                try:
                    results.append(task(p, attempt, f"r{self.run}-a{attempt}", batches))
                    break
                except InjectedTaskFailure:
                    if attempt + 1 == self.max_attempts:
                        raise
        return results

    def run_in_tasks(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        return [fn(item) for item in items]
