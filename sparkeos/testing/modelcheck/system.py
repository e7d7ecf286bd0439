"""The model's destination and commit-log store.

``ModelSystem`` is a two-phase system as the connectors see one: per transaction ID an
open or prepared transaction with its rows; ``begin`` claims its ID exclusively; an
attempt that begins after its (batch, partition) was committed writes nothing (the
marker check of the PostgreSQL sink); a rollback of an open transaction fences its
writer; committed rows become visible with a marker naming the transaction. Every
operation is one scheduling step, and the events that must never happen are checked
where they happen: a commit without a durable decision naming it (invariant 1), a
rollback of a decided attempt's prepared state (invariant 10), lost prepared state.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import AttemptFencedError, DataLossError, RecordExistsError
from sparkeos.core.protocol import (
    CommitLocation,
    Receipt,
    Transaction,
    TransactionalSink,
    TxnState,
)
from sparkeos.core.snapshot.commitlog import DECIDED, OUTCOME, Store, record_name
from sparkeos.core.snapshot.txpool import AttemptRange, TransactionPool

from .scheduler import Scheduler


@dataclass
class Held:
    state: str  # open | prepared
    rows: list[int]
    batch_id: int
    partition: int
    generation: int
    """Which begin created it: a commit must find the state its receipt names (as the
    PostgreSQL sink checks the xid, and the file sinks stage per attempt)."""


@dataclass
class ModelSystem:
    sched: Scheduler
    store: ModelStore
    name: str = "system"
    held: dict[str, Held] = field(default_factory=dict)
    fenced: set[str] = field(default_factory=set)
    markers: dict[tuple[int, int], str] = field(default_factory=dict)
    visible: list[int] = field(default_factory=list)
    generations: int = 0
    violations: list[str] = field(default_factory=list)
    reject_schema: Callable[[pa.Schema], str | None] | None = None
    changes: int = 0
    """Counts the changes of what ``fingerprint`` covers: whatever changes ``held``
    (or a ``Held``), ``fenced``, ``markers`` or ``visible`` calls ``changed()``."""
    on_change: Callable[[], None] | None = None
    """Told of every change: the exploration takes a state only after one."""
    _fingerprint: tuple[int, tuple[Any, ...]] | None = field(default=None, repr=False)
    """The last fingerprint and the ``changes`` it is of: the exploration takes one
    after every step, and most steps change nothing here."""

    def step(self, what: str) -> None:
        self.sched.point(f"{self.name}.{what}")

    def violation(self, text: str) -> None:
        self.violations.append(text)

    def changed(self) -> None:
        self.changes += 1
        if self.on_change is not None:
            self.on_change()

    def fingerprint(self) -> tuple[Any, ...]:
        if self._fingerprint is not None and self._fingerprint[0] == self.changes:
            return self._fingerprint[1]
        held = tuple(sorted([(k, v.state, tuple(v.rows)) for k, v in self.held.items()]))
        fingerprint = (held, tuple(sorted(self.fenced)), tuple(sorted(self.markers.items())),
                       tuple(sorted(self.visible)))
        self._fingerprint = (self.changes, fingerprint)
        return fingerprint


class ModelHandle:
    def __init__(self, txn: Transaction, skipped: bool = False) -> None:
        self.txn = txn
        self.skipped = skipped


class ModelSink(TransactionalSink[ModelHandle]):
    """The connector over ``ModelSystem``; ``commit_location`` is set per scenario."""

    def __init__(self, system: ModelSystem, commit_location: CommitLocation) -> None:
        self.system = system
        self.commit_location = commit_location  # type: ignore[misc]

    def validate(self, schema: pa.Schema) -> None:
        from sparkeos.core.errors import SchemaMismatchError

        problem = self.system.reject_schema(schema) if self.system.reject_schema else None
        if problem:
            raise SchemaMismatchError(problem)

    def begin(self, txn: Transaction) -> ModelHandle:
        system = self.system
        system.step(f"begin {txn.attempt} p{txn.partition}")
        if txn.txn_id in system.held:
            raise AttemptFencedError(f"{txn.txn_id} is in use by another attempt")
        if (txn.batch_id, txn.partition) in system.markers:
            return ModelHandle(txn, skipped=True)
        system.fenced.discard(txn.txn_id)
        system.generations += 1
        system.held[txn.txn_id] = Held("open", [], txn.batch_id, txn.partition,
                                       system.generations)
        system.changed()
        return ModelHandle(txn)

    def _own(self, handle: ModelHandle) -> Held:
        held = self.system.held.get(handle.txn.txn_id)
        if handle.txn.txn_id in self.system.fenced or held is None or held.state != "open":
            raise RuntimeError(f"{handle.txn.txn_id} was fenced (rolled back)")
        return held

    def write(self, handle: ModelHandle, batch: pa.RecordBatch) -> None:
        self.system.step(f"write {handle.txn.attempt} p{handle.txn.partition}")
        if not handle.skipped:
            self._own(handle).rows.extend(_ids_of(batch))
            self.system.changed()

    def prepare(self, handle: ModelHandle) -> Receipt:
        self.system.step(f"prepare {handle.txn.attempt} p{handle.txn.partition}")
        if handle.skipped:
            return {"rows": 0, "skipped": True}
        held = self._own(handle)
        held.state = "prepared"
        self.system.changed()
        return {"rows": len(held.rows), "generation": held.generation}

    def abort(self, handle: ModelHandle, txn: Transaction) -> None:
        held = self.system.held.get(txn.txn_id)
        if held is not None and held.state == "open" and not handle.skipped:
            self.system.step(f"abort {txn.attempt} p{txn.partition}")
            self.system.held.pop(txn.txn_id, None)
            self.system.changed()

    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        system = self.system
        system.step(f"commit {txn.attempt} p{txn.partition}")
        if not decided_names(system.store, txn):
            system.violation(f"invariant 1: {txn.txn_id} committed without a durable "
                             "decision naming it")
        held = system.held.get(txn.txn_id)
        if held is not None and held.state == "prepared" and (
                held.generation == receipt.get("generation")):
            del system.held[txn.txn_id]
            system.visible.extend(held.rows)
            system.markers[(txn.batch_id, txn.partition)] = txn.txn_id
            system.changed()
            return
        if system.markers.get((txn.batch_id, txn.partition)) == txn.txn_id:
            return
        if receipt.get("skipped"):
            return
        raise DataLossError(f"prepared transaction {txn.txn_id} is gone and uncommitted",
                            txn_id=txn.txn_id, batch_id=txn.batch_id)

    def rollback(self, txn: Transaction) -> None:
        self.system.step(f"rollback {txn.attempt} p{txn.partition}")
        self._rollback(txn.txn_id, txn)

    def _rollback(self, txn_id: str, txn: Transaction | None) -> None:
        system = self.system
        held = system.held.pop(txn_id, None)
        if held is None:
            return
        system.changed()
        if held.state == "open":
            system.fenced.add(txn_id)
        elif txn is not None and decided_names(system.store, txn):
            system.violation(f"invariant 10: the prepared state of decided attempt {txn_id} "
                             "was rolled back")

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        """One step, as the built-in connectors' sweeps are one listing or query."""
        if not ranges:
            return
        self.system.step(f"sweep batches {sorted({r.batch_id for r in ranges})}")
        query_key, sink = ranges[0].query_key, ranges[0].sink
        for txn_id in list(self.system.held):
            txn = parse_txn(query_key, sink, txn_id)
            if txn is not None and txn_id not in keep and any(r.covers(txn) for r in ranges):
                self._rollback(txn_id, txn)

    def probe(self, txn: Transaction) -> TxnState:
        held = self.system.held.get(txn.txn_id)
        if held is not None:
            return TxnState.PREPARED if held.state == "prepared" else TxnState.OPEN
        return TxnState.ABSENT


def decided_names(store: ModelStore, txn: Transaction) -> bool:
    """Does a durable decided outcome of ``txn``'s batch name this attempt?"""
    # The commit log names its records with ``record_name``: the outcome of the
    # attempt's run is that one file (a scan of the log parsed every record, at every
    # commit and rollback).
    data = store.files.get(record_name(txn.batch_id, OUTCOME, txn.run))
    if data is None:
        return False
    body = parsed_record(data)
    if body.get("outcome") != DECIDED:
        return False
    return any(int(p["partition"]) == txn.partition and int(p["tag"]) == txn.tag
               for p in body.get("participants", []))


@functools.lru_cache(maxsize=8192)
def parsed_record(data: bytes) -> dict[str, Any]:
    """A record's body as the model's checks read it. Shared between calls: read it,
    never change it. Schedules write the same few records over and over, and the
    checks read them at almost every step."""
    body: dict[str, Any] = json.loads(data)
    return body


@functools.lru_cache(maxsize=8192)
def parse_txn(query_key: str, sink: str, txn_id: str) -> Transaction | None:
    """``TransactionPool(query_key, sink).parse(txn_id)``, for the few IDs every
    schedule uses again (a ``Transaction`` is immutable)."""
    return TransactionPool(query_key, sink).parse(txn_id)


class ModelStore(Store):
    """The commit log's store in memory; every write is a scheduling step."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.location = "model://log"
        self.files: dict[str, bytes] = {}
        self.version = 0
        """Counts the writes: what was read of the store is current while it stands."""
        self._fingerprint: tuple[int, tuple[tuple[str, bytes], ...]] = (0, ())
        """The last fingerprint and the version it is of: most steps write nothing."""

    def list_names(self) -> list[str]:
        self.sched.point("log.list")
        return list(self.files)

    def read(self, name: str) -> bytes:
        return self.files[name]

    def write_new(self, name: str, data: bytes) -> None:
        self.sched.point(f"log.create {name[14:-5]}")
        if name in self.files:
            raise RecordExistsError(f"{name} exists")
        self.files[name] = data
        self.version += 1

    def replace(self, name: str, data: bytes) -> None:
        self.sched.point(f"log.replace {name}")
        self.files[name] = data
        self.version += 1

    def delete(self, name: str) -> None:
        self.files.pop(name, None)
        self.version += 1

    def fingerprint(self) -> tuple[tuple[str, bytes], ...]:
        version, fingerprint = self._fingerprint
        if version != self.version:
            fingerprint = tuple(sorted(self.files.items()))
            self._fingerprint = (self.version, fingerprint)
        return fingerprint


def id_rows(ids: Sequence[int]) -> pa.RecordBatch:
    return _id_rows(tuple(ids))


_IDS: dict[int, tuple[pa.RecordBatch, tuple[int, ...]]] = {}
"""By ``id()``: each batch ``id_rows`` made (kept, so the ``id`` stays its own) and
its ids, which ``ModelSink.write`` would otherwise convert back at every write."""


@functools.cache
def _id_rows(ids: tuple[int, ...]) -> pa.RecordBatch:
    # A record batch is immutable, and every schedule writes the same few partitions
    # (a few dozen in all): building one took a tenth of the model's own time.
    batch = pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64())})
    _IDS[id(batch)] = (batch, ids)
    return batch


def _ids_of(batch: pa.RecordBatch) -> Sequence[int]:
    known = _IDS.get(id(batch))
    if known is not None and known[0] is batch:
        return known[1]
    ids: list[int] = batch.column("id").to_pylist()
    return ids


__all__ = ["ModelHandle", "ModelSink", "ModelStore", "ModelSystem", "decided_names",
           "id_rows", "parse_txn", "parsed_record"]
