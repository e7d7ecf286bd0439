"""The three tables of ``SqlTableSink``, in SQLAlchemy Core (any dialect)."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from sparkeos.core.errors import (
    AttemptFencedError,
    ConfigurationError,
    RetriableError,
    SchemaMismatchError,
    SparkEOSError,
)
from sparkeos.core.snapshot.txpool import Transaction
from sparkeos.core.steps import commit_step

CREATE_TABLE_SETTINGS = ("SqlTableSink(create_table=True), or the format option "
                         "sparkeos.createTable=true (the formats' default)")

F = TypeVar("F", bound=Callable[..., Any])

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


def translated(doing: str) -> Callable[[F], F]:
    """The one place the driver's errors become sparkeos errors (never with the URL:
    SQLAlchemy's messages name the host and database, not the password)."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def run(self: Tables, *args: Any, **kwargs: Any) -> Any:
            with _translating(doing, self):
                return method(self, *args, **kwargs)
        return run  # type: ignore[return-value]
    return wrap


@contextlib.contextmanager
def _translating(doing: str, tables: Tables) -> Iterator[None]:
    import sqlalchemy as sa

    try:
        yield
    except SparkEOSError:
        raise
    except (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError) as exc:
        raise RetriableError(
            f"{doing} {tables.name} failed on {tables.where}: {_first_line(exc)}",
            fix="check that the database is up and reachable from the driver and every "
            "executor; restarting the query re-runs the batch, nothing is lost") from None
    except (sa.exc.ProgrammingError, sa.exc.NoSuchTableError, sa.exc.ArgumentError) as exc:
        raise ConfigurationError(
            f"{doing} {tables.name} failed on {tables.where}: {_first_line(exc)}",
            fix="check the table, its columns and the database user's rights") from None


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def is_nested(arrow: pa.DataType) -> bool:
    """Arrays, maps and structs: written as their JSON text (Spark's ``to_json``)."""
    return bool(pa.types.is_nested(arrow))


def sql_type(arrow: pa.DataType) -> Any:
    """The column type ``create_table`` gives a Spark type, as Spark's JDBC writer types
    it (its common types, and PostgreSQL's dialect where the two differ: ``real`` and
    ``double precision``, ``smallint`` for bytes, ``timestamp with time zone``), in
    SQLAlchemy's portable names, which each dialect spells its own way. Nested types,
    for which Spark's common types have no mapping, are text holding JSON."""
    import sqlalchemy as sa

    if pa.types.is_boolean(arrow):
        return sa.Boolean()
    if pa.types.is_integer(arrow):
        if arrow.bit_width <= 16:
            return sa.SmallInteger()
        return sa.Integer() if arrow.bit_width == 32 and pa.types.is_signed_integer(
            arrow) else sa.BigInteger()
    if pa.types.is_floating(arrow):
        return sa.Double() if arrow.bit_width == 64 else sa.REAL()
    if pa.types.is_decimal(arrow):
        return sa.Numeric(arrow.precision, arrow.scale)
    if pa.types.is_timestamp(arrow):
        return sa.DateTime(timezone=arrow.tz is not None)
    if pa.types.is_date(arrow):
        return sa.Date()
    if pa.types.is_binary(arrow) or pa.types.is_large_binary(arrow):
        return sa.LargeBinary()
    return sa.Text()


def _spelled(column_type: Any, engine: Any) -> str:
    """A column type as the database spells it (``INTEGER[]``, not ``ARRAY``)."""
    try:
        return str(column_type.compile(dialect=engine.dialect))
    except Exception:  # a type the dialect cannot render: its generic name
        return str(column_type)


class Tables:
    def __init__(self, engine: Any, table: str) -> None:
        import sqlalchemy as sa

        self.engine, self.name, self.sa = engine, table, sa
        self.where = engine.url.render_as_string(hide_password=True)
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

    @translated("checking")
    def ensure(self, schema: pa.Schema, create: bool) -> None:
        sa = self.sa
        if not sa.inspect(self.engine).has_table(self.name):
            if not create:
                raise ConfigurationError(
                    f"table {self.name} does not exist, and creating it is off",
                    fix="create it, or let sparkeos create it from the DataFrame's schema: "
                    f"{CREATE_TABLE_SETTINGS}; nothing was written")
            sa.Table(self.name, sa.MetaData(),
                     *[sa.Column(f.name, sql_type(f.type)) for f in schema]
                     ).create(self.engine, checkfirst=True)
        target = self._target()
        missing = [n for n in schema.names if n not in target.columns]
        if missing:
            raise SchemaMismatchError(f"columns {missing} are not in table {self.name}",
                                      fix="select only the table's columns; nothing written")
        not_text = [f"{f.name} ({_spelled(target.columns[f.name].type, self.engine)})"
                    for f in schema
                    if is_nested(f.type)
                    and not isinstance(target.columns[f.name].type, (sa.String, sa.JSON))]
        if not_text:
            raise SchemaMismatchError(
                f"columns {', '.join(not_text)} of table {self.name} hold arrays, maps or "
                "structs, which the SQL sink writes as JSON text; the columns are not text",
                fix="write into a new table (create_table=True makes them text), or change "
                "the columns' type to a text or JSON type; nothing was written")
        self._stage(target)
        self.meta.create_all(self.engine, checkfirst=True)

    @translated("claiming a transaction in")
    def claim(self, txn: Transaction) -> bool:
        try:
            with self.engine.begin() as conn:
                conn.execute(self.txns.insert().values(txn_id=txn.txn_id, committed=False))
        except self.sa.exc.IntegrityError:
            return False
        return True

    @translated("staging rows for")
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

    @translated("committing into")
    def publish(self, txn: Transaction, columns: list[str],
                key: Sequence[str] = ()) -> int | None:
        """Move ``txn``'s rows into the target, atomically (replacing the target's rows
        with the same ``key``, if given); None if it is not staged."""
        sa = self.sa
        target = self._target()
        stage = self._stage(target)
        with self.engine.begin() as conn:
            # Claim first, with a write: a twin commit of the same ID (the driver and
            # `recover --force`) waits on this row until we commit, then finds it
            # committed. A plain read here let both twins copy the stage.
            claimed = conn.execute(self.txns.update().where(
                self.txns.c.txn_id == txn.txn_id, self.txns.c.committed.is_(False)
            ).values(committed=True)).rowcount
            if claimed != 1:
                held = conn.execute(sa.select(self.txns.c.committed).where(
                    self.txns.c.txn_id == txn.txn_id)).first()
                return None if held is None else 0
            commit_step("claimed", txn)
            mine = stage.c[TXN_COLUMN] == txn.txn_id
            moved = 0
            if columns:  # else an empty partition staged nothing
                if key:
                    same_key = sa.and_(mine, *[stage.c[k] == target.c[k] for k in key])
                    conn.execute(target.delete().where(
                        sa.exists(sa.select(stage.c[TXN_COLUMN]).where(same_key))))
                moved = conn.execute(target.insert().from_select(
                    columns, sa.select(*[stage.c[c] for c in columns]).where(mine))).rowcount
            conn.execute(stage.delete().where(mine))
            commit_step("moved", txn)
        return int(moved)

    @translated("purging old claims of")
    def purge_committed(self, prefix: str, before_batch: int,
                        batch_of: Callable[[str], int | None]) -> int:
        """Delete the committed claims of this (query, sink) (``prefix``) for batches
        before ``before_batch``: bookkeeping that would otherwise grow by one row per
        participant and batch for as long as the query runs."""
        txns = self.txns
        with self.engine.begin() as conn:
            ids = conn.execute(self.sa.select(txns.c.txn_id).where(
                txns.c.committed.is_(True), txns.c.txn_id.like(f"{prefix}%"))
            ).scalars().all()
            old = [t for t in ids if (batch_of(t) or before_batch) < before_batch]
            for start in range(0, len(old), 500):
                conn.execute(txns.delete().where(txns.c.txn_id.in_(old[start:start + 500]),
                                                 txns.c.committed.is_(True)))
        return len(old)

    @translated("rolling back staged rows of")
    def discard(self, txn_ids: list[str]) -> None:
        if not txn_ids:
            return
        stage = self._stage(self._target())
        with self.engine.begin() as conn:
            conn.execute(stage.delete().where(stage.c[TXN_COLUMN].in_(txn_ids)))
            conn.execute(self.txns.delete().where(self.txns.c.txn_id.in_(txn_ids))
                         .where(self.txns.c.committed.is_(False)))

    @translated("listing staged transactions of")
    def uncommitted(self, prefix: str) -> list[str]:
        """IDs of this (query, sink) with staged rows or an uncommitted claim."""
        stage = self._stage(self._target())
        with self.engine.connect() as conn:
            claims = conn.execute(self.sa.select(self.txns.c.txn_id).where(
                self.txns.c.committed.is_(False))).scalars().all()
            staged = conn.execute(self.sa.select(stage.c[TXN_COLUMN]).distinct()
                                  ).scalars().all()
        return sorted(t for t in {*claims, *staged} if t and t.startswith(prefix))

    @translated("listing committed transactions of")
    def committed(self) -> list[str]:
        """Every committed transaction ID (for the lost-checkpoint check)."""
        if not self.sa.inspect(self.engine).has_table(self.txns.name):
            return []
        with self.engine.connect() as conn:
            return list(conn.execute(self.sa.select(self.txns.c.txn_id).where(
                self.txns.c.committed.is_(True))).scalars().all())
