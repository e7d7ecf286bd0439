"""The three tables of ``SqlTableSink``, in SQLAlchemy Core (any dialect)."""

from __future__ import annotations

import functools
import os
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import AttemptFencedError, SchemaMismatchError
from sparkeos.core.txpool import Transaction

TXN_COLUMN = "_sparkeos_txn"


@functools.lru_cache(maxsize=16)
def _engine(url: str, pid: int) -> Any:
    from sqlalchemy import create_engine

    # SQLite serialises writers: wait for the lock instead of failing at once.
    args = {"timeout": 60} if url.startswith("sqlite") else {}
    return create_engine(url, connect_args=args, pool_pre_ping=True)


def engine_for(url: str) -> Any:
    """One engine per URL and process (a forked Spark worker opens its own)."""
    return _engine(url, os.getpid())


def _sql_type(arrow: pa.DataType) -> Any:
    import sqlalchemy as sa

    checks = [(pa.types.is_boolean, sa.Boolean), (pa.types.is_integer, sa.BigInteger),
              (pa.types.is_floating, sa.Float), (pa.types.is_timestamp, sa.DateTime),
              (pa.types.is_date, sa.Date), (pa.types.is_binary, sa.LargeBinary),
              (pa.types.is_decimal, sa.Numeric)]
    return next((kind() for check, kind in checks if check(arrow)), sa.Text())


class Tables:
    def __init__(self, engine: Any, table: str) -> None:
        import sqlalchemy as sa

        self.engine, self.name, self.sa = engine, table, sa
        self.meta = sa.MetaData()
        self.txns = sa.Table(f"{table}__sparkeos_txn", self.meta,
                             sa.Column("txn_id", sa.String(200), primary_key=True),
                             sa.Column("committed", sa.Boolean, nullable=False))

    def _target(self) -> Any:
        return self.sa.Table(self.name, self.sa.MetaData(), autoload_with=self.engine)

    def _stage(self, target: Any) -> Any:
        sa = self.sa
        columns = [sa.Column(c.name, c.type) for c in target.columns]
        return sa.Table(f"{self.name}__sparkeos_stage", self.meta,
                        sa.Column(TXN_COLUMN, sa.String(200), index=True), *columns,
                        extend_existing=True)

    def ensure(self, schema: pa.Schema, create: bool) -> None:
        sa = self.sa
        if not sa.inspect(self.engine).has_table(self.name):
            if not create:
                raise SchemaMismatchError(f"table {self.name} does not exist",
                                          fix="create it, or pass create_table=True")
            sa.Table(self.name, sa.MetaData(),
                     *[sa.Column(f.name, _sql_type(f.type)) for f in schema]
                     ).create(self.engine, checkfirst=True)
        target = self._target()
        missing = [n for n in schema.names if n not in target.columns]
        if missing:
            raise SchemaMismatchError(f"columns {missing} are not in table {self.name}",
                                      fix="select only the table's columns; nothing written")
        self._stage(target)
        self.meta.create_all(self.engine, checkfirst=True)

    def claim(self, txn: Transaction) -> bool:
        try:
            with self.engine.begin() as conn:
                conn.execute(self.txns.insert().values(txn_id=txn.txn_id, committed=False))
        except self.sa.exc.IntegrityError:
            return False
        return True

    def stage(self, txn: Transaction, rows: list[dict[str, Any]]) -> None:
        stage = self._stage(self._target())
        with self.engine.begin() as conn:
            held = conn.execute(self.sa.select(self.txns.c.committed).where(
                self.txns.c.txn_id == txn.txn_id)).first()
            if held is None or held.committed:
                raise AttemptFencedError(f"{txn.txn_id} was rolled back or committed",
                                         sink=txn.sink, batch_id=txn.batch_id,
                                         txn_id=txn.txn_id)
            conn.execute(stage.insert(), [{TXN_COLUMN: txn.txn_id, **r} for r in rows])

    def publish(self, txn: Transaction, columns: list[str]) -> int | None:
        """Move ``txn``'s rows into the target, atomically; None if it is not staged."""
        sa = self.sa
        target = self._target()
        stage = self._stage(target)
        with self.engine.begin() as conn:
            held = conn.execute(sa.select(self.txns.c.committed).where(
                self.txns.c.txn_id == txn.txn_id)).first()
            if held is None or held.committed:
                return None if held is None else 0
            mine = stage.c[TXN_COLUMN] == txn.txn_id
            moved = conn.execute(target.insert().from_select(
                columns, sa.select(*[stage.c[c] for c in columns]).where(mine))).rowcount
            conn.execute(stage.delete().where(mine))
            conn.execute(self.txns.update().where(self.txns.c.txn_id == txn.txn_id)
                         .values(committed=True))
        return int(moved)

    def discard(self, txn_ids: list[str]) -> None:
        if not txn_ids:
            return
        stage = self._stage(self._target())
        with self.engine.begin() as conn:
            conn.execute(stage.delete().where(stage.c[TXN_COLUMN].in_(txn_ids)))
            conn.execute(self.txns.delete().where(self.txns.c.txn_id.in_(txn_ids))
                         .where(self.txns.c.committed.is_(False)))

    def uncommitted(self, prefix: str) -> list[str]:
        """IDs of this (query, sink) with staged rows or an uncommitted claim."""
        stage = self._stage(self._target())
        with self.engine.connect() as conn:
            claims = conn.execute(self.sa.select(self.txns.c.txn_id).where(
                self.txns.c.committed.is_(False))).scalars().all()
            staged = conn.execute(self.sa.select(stage.c[TXN_COLUMN]).distinct()
                                  ).scalars().all()
        return sorted(t for t in {*claims, *staged} if t and t.startswith(prefix))
