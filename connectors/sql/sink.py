"""A reference connector: exactly-once into any SQL database, through a staging table.

For databases without two-phase commit (SQLite, MySQL, ...): a task attempt writes its
rows into ``<table>__sparkeos_stage`` tagged with its transaction ID (durable,
invisible); the commit moves them into ``table`` in one local transaction, together
with the attempt's row in ``<table>__sparkeos_txn``, which claims the ID (``begin``),
marks it committed (idempotent commit) and tells a lost transaction from a committed
one. Any SQLAlchemy URL works; ``validate`` creates the two bookkeeping tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkeos.core import AttemptFencedError, DataLossError, Transaction, TransactionalSink
from sparkeos.core.txpool import AttemptRange, TransactionPool

from .tables import Tables, engine_for


@dataclass
class Staging:
    txn: Transaction
    columns: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SqlTableSink(TransactionalSink[Staging]):
    """``url``: an SQLAlchemy URL (a secret: never printed); ``table``: the target, which
    must exist unless ``create_table`` (then created from the first batch's schema)."""

    url: str = field(repr=False)
    table: str
    create_table: bool = False

    secret_fields = frozenset({"url"})

    @property
    def _tables(self) -> Tables:
        return Tables(engine_for(self.url), self.table)

    def validate(self, schema: pa.Schema) -> None:
        self._tables.ensure(schema, self.create_table)

    def begin(self, txn: Transaction) -> Staging:
        if not self._tables.claim(txn):
            raise AttemptFencedError(f"{txn.txn_id} is held by another attempt",
                                     sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id)
        return Staging(txn)

    def write(self, handle: Staging, batch: pa.RecordBatch) -> None:
        handle.columns = batch.schema.names
        self._tables.stage(handle.txn, batch.to_pylist())

    def prepare(self, handle: Staging) -> dict[str, Any]:
        return {"columns": handle.columns}  # the staged rows are durable already

    def commit(self, txn: Transaction, receipt: dict[str, Any]) -> None:
        if self._tables.publish(txn, receipt["columns"]) is None:
            raise DataLossError(
                f"transaction {txn.txn_id} of a decided batch is no longer staged in "
                f"{self.table}__sparkeos_stage", sink=txn.sink, batch_id=txn.batch_id,
                txn_id=txn.txn_id, fix="re-process this batch from the source")

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
