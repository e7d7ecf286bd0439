"""A reference connector: exactly-once into any SQL database, through a staging table.

For databases without two-phase commit (SQLite, MySQL, ...): a task attempt writes its
rows into ``<table>__sparkeos_stage`` tagged with its transaction ID (durable,
invisible); the commit moves them into ``table`` in one local transaction, together
with the attempt's row in ``<table>__sparkeos_txn``, which claims the ID (``begin``),
marks it committed (idempotent commit) and tells a lost transaction from a committed
one. Any SQLAlchemy URL works; ``validate`` creates the two bookkeeping tables.

With ``key``, the commit replaces by key (an exactly-once upsert for update-mode
aggregations, in any dialect): it deletes the target rows whose key is staged, then
inserts the staged rows, in the same local transaction. The batch is hash-partitioned
by the key (``cluster_by``); a key repeated within a batch is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkeos.core import (
    AttemptFencedError,
    ConfigurationError,
    DataLossError,
    DataRejectedError,
    SchemaMismatchError,
    Transaction,
    TransactionalSink,
)
from sparkeos.core.snapshot.txpool import AttemptRange, TransactionPool
from sparkeos.core.text.sparkjson import json_values

from .tables import Tables, engine_for, is_nested

PURGE_EVERY = 10
"""Partition 0's commit of every this many batches deletes old committed claims."""


@dataclass
class Staging:
    txn: Transaction
    columns: list[str] = field(default_factory=list)
    keys: set[tuple[Any, ...]] = field(default_factory=set)


@dataclass(frozen=True)
class SqlTableSink(TransactionalSink[Staging]):
    """``url``: an SQLAlchemy URL (a secret: never printed); ``table``: the target, which
    must exist unless ``create_table`` (then created from the first batch's schema);
    ``key``: columns to replace rows by (an upsert), instead of appending."""

    url: str = field(repr=False)
    table: str
    create_table: bool = False
    key: Sequence[str] | None = None
    claim_retention: int = 1000
    """Committed claims of batches older than this many batches are deleted (every
    ``PURGE_EVERY`` batches); keep it above the commit log's ``retain_batches``."""

    secret_fields = frozenset({"url"})
    commit_steps = ("claimed", "moved")

    def __post_init__(self) -> None:
        if not isinstance(self.claim_retention, int) or self.claim_retention < 10:
            raise ConfigurationError(f"claim_retention={self.claim_retention!r} is too small",
                                     fix="keep at least 10 batches (default 1000)")
        key = (self.key,) if isinstance(self.key, str) else self.key
        if key is not None:
            key = tuple(key)
            if not key or not all(isinstance(k, str) and k for k in key):
                raise ConfigurationError(f"key={list(key)!r}: give column names",
                                         fix="key=['word']")
        object.__setattr__(self, "key", key)

    def cluster_by(self) -> tuple[str, ...]:
        return tuple(self.key or ())

    @property
    def _tables(self) -> Tables:
        return Tables(engine_for(self.url), self.table)

    def validate(self, schema: pa.Schema) -> None:
        missing = [k for k in self.key or () if k not in schema.names]
        if missing:
            raise SchemaMismatchError(f"key columns {missing} are not in the DataFrame",
                                      fix="select them, or change key=; nothing was written")
        self._tables.ensure(schema, self.create_table)

    def begin(self, txn: Transaction) -> Staging:
        if not self._tables.claim(txn):
            raise AttemptFencedError(f"{txn.txn_id} is held by another attempt",
                                     sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id)
        return Staging(txn)

    def write(self, handle: Staging, batch: pa.RecordBatch) -> None:
        handle.columns = batch.schema.names
        rows = as_json_text(batch).to_pylist()
        if self.key:
            self._refuse_repeated_keys(handle, rows)
        self._tables.stage(handle.txn, rows)

    def _refuse_repeated_keys(self, handle: Staging, rows: list[dict[str, Any]]) -> None:
        assert self.key
        for row in rows:
            value = tuple(row[k] for k in self.key)
            if value in handle.keys:
                txn = handle.txn
                raise DataRejectedError(
                    f"key {dict(zip(self.key, value, strict=True))} appears more than once "
                    f"in batch {txn.batch_id}: with key= one row per key is written, and "
                    "nothing says which is the latest; the batch is rolled back",
                    sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
                    fix="deduplicate the batch by key before the sink (e.g. an "
                    "aggregation), then restart the query")
            handle.keys.add(value)

    def prepare(self, handle: Staging) -> dict[str, Any]:
        return {"columns": handle.columns}  # the staged rows are durable already

    def commit(self, txn: Transaction, receipt: dict[str, Any]) -> None:
        if self._tables.publish(txn, receipt["columns"], self.key or ()) is None:
            raise DataLossError(
                f"transaction {txn.txn_id} of a decided batch is no longer staged in "
                f"{self.table}__sparkeos_stage", sink=txn.sink, batch_id=txn.batch_id,
                txn_id=txn.txn_id, fix="re-process this batch from the source")
        if txn.partition == 0 and txn.batch_id % PURGE_EVERY == 0:
            pool = TransactionPool(txn.query_key, txn.sink)
            self._tables.purge_committed(
                pool.prefix, txn.batch_id - self.claim_retention,
                lambda t: parsed.batch_id if (parsed := pool.parse(t)) else None)

    def rollback(self, txn: Transaction) -> None:
        self._tables.discard([txn.txn_id])

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        pool = TransactionPool(ranges[0].query_key, ranges[0].sink)
        doomed = []
        for txn_id in self._tables.uncommitted(pool.prefix):
            txn = pool.parse(txn_id)
            if txn and txn_id not in keep and any(r.covers(txn) for r in ranges):
                doomed.append(txn_id)
        self._tables.discard(doomed)

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        others = sorted({t.split("-")[1] for t in self._tables.committed()
                         if t.startswith("seos-") and f"-{sink}-p" in t
                         and not t.startswith(f"seos-{query_key}-")})
        return f"committed transactions of query keys {', '.join(others)}" if others else None

    def identity(self) -> dict[str, Any]:
        return {"database": engine_for(self.url).url.render_as_string(hide_password=True),
                "table": self.table}


def as_json_text(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with each array, map and struct column as its JSON text, as Spark's
    ``to_json`` writes it (the SQL sink's columns for them are text)."""
    nested = [i for i, f in enumerate(batch.schema) if is_nested(f.type)]
    if not nested:
        return batch
    columns = list(batch.columns)
    for i in nested:
        columns[i] = json_values(columns[i])
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)

