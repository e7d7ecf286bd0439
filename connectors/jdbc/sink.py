"""Exactly-once PostgreSQL sink: two-phase commit with the pool's IDs as gids.

Phase 1, in each Spark task attempt (``mode="transactional"``, the default); every
attempt has its own gid, the attempt's transaction ID::

    begin    session named after the attempt; BEGIN; insert the attempt's marker row
             (query, sink, batch, partition, gid), unless a marker shows another
             attempt already committed the partition (this attempt then writes nothing)
    write    COPY ... FROM STDIN (CSV made by pyarrow), never row by row
    prepare  PREPARE TRANSACTION '<gid>'; the receipt carries rows and the xid

Phase 2, on the driver: ``COMMIT PREPARED '<gid>'`` for the attempt ``decided(N)``
names, after checking in ``pg_prepared_xacts`` that it is the transaction the receipt
names (same xid). PostgreSQL answers "does not exist" both for a committed gid and for
one rolled back behind our back: the marker row, committed atomically with the data,
tells them apart (it names the gid: already committed, a no-op; absent:
``DataLossError``). Then the coordinator's sweep ends the sessions and rolls back the
prepared transactions of every other attempt of the batch (one query each).

What a DBA sees: prepared transactions named ``seos-<query key>-<sink>-p<partition>-
s<slot>-b<batch>r<run>a<attempt>`` (normally one per partition and sink, between the
prepare and the commit of a batch), sessions named ``seos-<query key>-<sink hash>-
<partition>-<batch>-<run>-<attempt>`` while a task writes, and the marker table
(default ``sparkeos_markers``). A prepared ``seos-...`` transaction left behind is
resolved by restarting the query or by ``sparkeos recover <checkpointLocation>``;
never commit one by hand unless the commit log says its batch was decided.

``mode="upsert"`` (``key`` required) writes by key: ``INSERT ... SELECT ... ON CONFLICT
(key) DO UPDATE``. Under ``exactly_once`` each task attempt COPYs into a stage table of
its own and commits it (phase 1); the driver applies the decided stages, each in one
local transaction with the marker row, and drops them (phase 2; see ``upsert.py`` for
why not inside a prepared transaction). The batch is hash-partitioned by the key first
(``cluster_by``), so the partitions of a batch never write the same row. A key repeated
within a batch keeps the row with the greatest ``order_by`` value, and is refused
without ``order_by``. Under ``at_least_once`` each task upserts from a temporary table
and commits at once (no marker row; a replayed batch overwrites the same rows). Neither
prepares a transaction, so upserts work where ``max_prepared_transactions`` is 0.

Other databases: ``dsn`` also takes an SQLAlchemy URL or engine for PostgreSQL. A sink
for another database with two-phase commit follows this file with SQLAlchemy's API in
place of the SQL statements: ``conn.begin_twophase(gid)`` in ``begin``, ``tx.prepare()``
in ``prepare``, ``conn.commit_prepared(gid, recover=True)`` in ``commit``,
``conn.rollback_prepared(gid, recover=True)`` in ``rollback`` and
``conn.recover_twophase()`` in ``probe``; the marker-row logic stays as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkeos.core.config import Guarantee
from sparkeos.core.errors import (
    AttemptFencedError,
    ConfigurationError,
    DataLossError,
    DataRejectedError,
    SchemaMismatchError,
    TransactionIdCollisionError,
)
from sparkeos.core.observe import log_event
from sparkeos.core.protocol import Receipt, Transaction, TransactionalSink, TxnState
from sparkeos.core.steps import commit_step
from sparkeos.core.txpool import AttemptRange, TransactionPool

from . import arrowpg, markers, prepared, upsert
from . import dsn as dsn_mod
from .connections import POOL, discard
from .errors import (
    DUPLICATE_TABLE,
    OBJECT_IN_USE,
    OUT_OF_MEMORY,
    UNDEFINED_OBJECT,
    pg_code,
    prepared_limit_error,
    translate_error,
)

MODES = ("transactional", "upsert")
MAX_GID_LENGTH = 199
"""PostgreSQL's GIDSIZE is 200 bytes including the terminating NUL."""
STAGE_TABLE = "sparkeos_stage"
DSN_ENV = "SPARKEOS_POSTGRES_DSN"

# (dsn, table, ..., schema) -> when the check expires; validate runs before every batch on
# the driver, and the catalog rarely changes under a running query.
_VALIDATED: dict[tuple[Any, ...], float] = {}
VALIDATION_TTL_S = 300.0
# max_prepared_transactions per DSN, read by validate(): a restart of PostgreSQL is
# needed to change it.
_PREPARED_LIMIT: dict[str, int] = {}


@dataclass
class PgTransaction:
    """The handle of one task's open transaction."""

    txn: Transaction
    conn: Any
    gid: str
    xid: int | None = None
    rows: int = 0
    columns: tuple[str, ...] | None = None
    staged: bool = False
    skipped: bool = False
    """Another attempt already committed this (batch, partition): write nothing."""


@dataclass(frozen=True)
class PostgresSink(TransactionalSink[PgTransaction]):
    """Write each batch into a PostgreSQL table, exactly once (or idempotently).

    ``dsn``: libpq string, ``postgresql://`` URL, SQLAlchemy URL (``postgresql+psycopg2://``,
    an ``sqlalchemy.engine.URL``) or engine; a secret: never printed or logged.
    ``table``: ``"name"`` or ``"schema.name"``, taken literally (case-sensitive).
    ``key``: key columns of the table; required for ``mode="upsert"``; with
    ``create_table`` it becomes the primary key.
    ``mode``: ``"transactional"`` (two-phase commit of appended rows) or ``"upsert"``
    (``INSERT ... ON CONFLICT (key) DO UPDATE``: exactly-once under ``exactly_once``,
    idempotent under ``at_least_once``); both give every guarantee.
    ``order_by``: for ``mode="upsert"``, the column(s) deciding which row of a key
    repeated within one batch is written (the greatest wins; equal values: any one of
    them). Without it a repeated key refuses the batch (``DataRejectedError``).
    ``commit_in_task``: for ``mode="upsert"``: None (default) chooses by the guarantee
    (exactly-once: stage, then apply on the driver; otherwise each task commits its
    upsert at once); True always commits in the task (at-least-once only).
    ``create_table``: create the table from the DataFrame's schema when it is missing.
    ``columns``: DataFrame column -> table column, for names that differ.
    ``marker_table``: bookkeeping table of committed (query, sink, batch, partition).
    ``lock_timeout_s``: how long a write may wait for a row lock; a wait usually means
    the same key in two partitions of one batch, which otherwise never resolves.
    ``marker_retention``: marker rows of batches older than this many batches are
    deleted (keep it above Spark's ``minBatchesToRetain``, default 100).
    """

    dsn: Any = field(repr=False)
    table: str
    key: Sequence[str] | None = None
    mode: str = "transactional"
    create_table: bool = False
    columns: Mapping[str, str] | None = None
    marker_table: str = "sparkeos_markers"
    lock_timeout_s: float = 30.0
    marker_retention: int = 1000
    connect_timeout_s: int = 10
    order_by: Sequence[str] | None = None
    commit_in_task: bool | None = None

    secret_fields = frozenset({"dsn"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "dsn", dsn_mod.to_libpq(self.dsn))
        _split_name(self.table, "table")
        _split_name(self.marker_table, "marker_table")
        if self.mode not in MODES:
            raise ConfigurationError(f"unknown mode {self.mode!r}",
                                     fix=f"use one of: {', '.join(MODES)}")
        key = self.key
        if isinstance(key, str):
            key = (key,)
        if key is not None:
            key = tuple(key)
            if not key or not all(isinstance(k, str) and k for k in key) or len(set(key)) != len(
                key
            ):
                raise ConfigurationError(f"key={list(key)!r}: give distinct column names",
                                         fix="key=['order_id']")
        object.__setattr__(self, "key", key)
        order_by = self.order_by
        if isinstance(order_by, str):
            order_by = (order_by,)
        if order_by is not None:
            order_by = tuple(order_by)
            if (self.mode != "upsert" or not order_by
                    or not all(isinstance(c, str) and c for c in order_by)):
                raise ConfigurationError(
                    f"order_by={list(order_by)!r} needs mode='upsert' and column names",
                    fix="PostgresSink(..., mode='upsert', key=['id'], order_by=['updated_at'])")
            if set(order_by) & set(key or ()):
                raise ConfigurationError(f"order_by={list(order_by)!r} repeats a key column",
                                         fix="order by a column that is not part of the key")
        object.__setattr__(self, "order_by", order_by)
        if self.commit_in_task not in (None, True, False) or (
                self.commit_in_task is not None and self.mode != "upsert"):
            raise ConfigurationError(f"commit_in_task={self.commit_in_task!r} needs "
                                     "mode='upsert' and None, True or False")
        if self.mode == "upsert" and not key:
            raise ConfigurationError(
                "mode='upsert' needs key columns (the ON CONFLICT target)",
                fix="PostgresSink(..., mode='upsert', key=['order_id']); the table needs a "
                "unique index or primary key on exactly those columns",
            )
        if self.columns is not None:
            mapping = dict(self.columns)
            if not all(isinstance(k, str) and isinstance(v, str) and k and v
                       for k, v in mapping.items()):
                raise ConfigurationError("columns must map DataFrame column names to table "
                                         "column names", fix="columns={'id': 'order_id'}")
            object.__setattr__(self, "columns", mapping)
        if not self.lock_timeout_s > 0:
            raise ConfigurationError(f"lock_timeout_s={self.lock_timeout_s} must be > 0")
        if self.marker_retention < 10:
            raise ConfigurationError(
                f"marker_retention={self.marker_retention} is too small",
                fix="keep at least as many batches as Spark's minBatchesToRetain (100)",
            )
        if self.connect_timeout_s < 1:
            raise ConfigurationError(f"connect_timeout_s={self.connect_timeout_s} must be >= 1")

    def __hash__(self) -> int:
        return hash((self.dsn, self.table, self.mode, self.marker_table, self.commit_in_task))

    # -- what the coordinator reads -------------------------------------------------------
    @property  # a property: the guarantee depends on the mode
    def guarantees(self) -> frozenset[Guarantee]:  # type: ignore[override]
        if self._plain:
            return frozenset({Guarantee.AT_LEAST_ONCE, Guarantee.NONE})
        return frozenset(Guarantee)

    @property  # a property: the commit differs by mode
    def commit_steps(self) -> tuple[str, ...]:  # type: ignore[override]
        if self._staged:
            return ("claimed", "applied")
        return () if self._plain else ("looked_up", "committed")

    def for_guarantee(self, guarantee: Guarantee) -> PostgresSink:
        if self.mode == "upsert" and self.commit_in_task is None:
            return dataclasses.replace(
                self, commit_in_task=guarantee is not Guarantee.EXACTLY_ONCE)
        return self

    def cluster_by(self) -> tuple[str, ...]:
        if self.mode != "upsert" or not self.key:
            return ()
        to_frame = {table: frame for frame, table in (self.columns or {}).items()}
        return tuple(to_frame.get(k, k) for k in self.key)

    @property
    def _prepared(self) -> bool:
        """Append in prepared transactions, committed by gid on the driver."""
        return self.mode == "transactional"

    @property
    def _staged(self) -> bool:
        """Exactly-once upsert: stage in the task, apply on the driver."""
        return self.mode == "upsert" and self.commit_in_task is not True

    @property
    def _plain(self) -> bool:
        """At-least-once upsert: each task commits its own transaction."""
        return self.mode == "upsert" and self.commit_in_task is True

    def identity(self) -> dict[str, Any]:
        return {"target": dsn_mod.target(self.dsn), "table": self.table, "mode": self.mode}

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["target"] = dsn_mod.redact(self.dsn)  # no password
        return out

    @classmethod
    def from_description(cls, description: Mapping[str, Any]) -> PostgresSink:
        """Rebuild from ``describe()``: the DSN is not stored; it comes from
        ``$SPARKEOS_POSTGRES_DSN``, else the stored target without password (libpq then
        uses PGPASSWORD / ~/.pgpass)."""
        args = dict(description)
        stored_target = args.pop("target", None)
        if "dsn" not in args:
            args["dsn"] = os.environ.get(DSN_ENV) or stored_target
        return cls(**args)

    # -- driver, before each batch -------------------------------------------------------------
    def validate(self, schema: pa.Schema) -> None:
        names = self._target_names(schema)
        cache_key = (self.dsn, self.table, self.mode, self.commit_in_task, self.key,
                     self.order_by, self.marker_table,
                     self.create_table, names,
                     tuple((f.name, str(f.type), f.nullable) for f in schema))
        if _VALIDATED.get(cache_key, 0.0) > time.monotonic():
            return
        with self._db("checking the destination table", phase="setup"):
            POOL.run(self.dsn, self.connect_timeout_s,
                     lambda conn: self._validate_on(conn, schema, names))
        _VALIDATED[cache_key] = time.monotonic() + VALIDATION_TTL_S

    def check_participants(self, count: int) -> None:
        limit = _PREPARED_LIMIT.get(self.dsn)
        if not self._prepared or limit is None or limit >= 2 * count:
            return
        raise ConfigurationError(
            f"this batch has {count} participants, each holding a prepared transaction "
            f"until phase 2 (and a retried or speculative attempt one more), but "
            f"{self._target} allows max_prepared_transactions = {limit}: at least "
            f"{2 * count} are needed; nothing was written",
            fix=f"write with fewer transactions: exactly_once(..., writers={max(1, limit // 2)})"
            f" (or fewer); or raise max_prepared_transactions to at least {2 * count} x the "
            "sinks writing to this server and restart PostgreSQL")

    def _validate_on(self, conn: Any, schema: pa.Schema, names: tuple[str, ...]) -> None:

        with conn.cursor() as cur:
            if self._prepared:
                cur.execute("SHOW max_prepared_transactions")
                limit = int(cur.fetchone()[0])
                _PREPARED_LIMIT[self.dsn] = limit
                if limit == 0:
                    raise prepared_limit_error(0, target=self._target)
            columns = self._table_columns(conn, cur)
            if columns is None:
                if not self.create_table:
                    raise SchemaMismatchError(
                        f"table {self.table} does not exist on {self._target}",
                        fix="create it, or pass create_table=True to create it from the "
                        "DataFrame's schema; nothing was written",
                    )
                cur.execute(self._create_table_sql(schema, names))
                log_event("postgres.table_created", table=self.table, target=self._target)
                columns = self._table_columns(conn, cur)
                assert columns is not None
            self._check_fit(schema, names, columns)
            if self.mode == "upsert":
                self._check_unique_key(cur)
            if not self._plain:
                markers.ensure_table(cur, self._ident(self.marker_table))

    def _table_columns(self, conn: Any, cur: Any) -> dict[str, tuple[str, str, str, bool, bool,
                                                                    bool]] | None:
        name = self._ident(self.table).as_string(conn)
        cur.execute("SELECT to_regclass(%s)::oid", (name,))
        oid = cur.fetchone()[0]
        if oid is None:
            return None
        generated = "a.attgenerated <> ''" if conn.server_version >= 120000 else "false"
        cur.execute(
            "SELECT a.attname::text, t.typname::text, t.typcategory::text,"
            " format_type(a.atttypid, a.atttypmod), a.attnotnull,"
            " a.atthasdef OR a.attidentity <> '', " + generated +
            " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
            " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (oid,),
        )
        return {r[0]: (r[1], r[2], r[3], r[4], r[5], r[6]) for r in cur.fetchall()}

    def _check_fit(self, schema: pa.Schema, names: tuple[str, ...],
                   columns: Mapping[str, tuple[str, str, str, bool, bool, bool]]) -> None:
        problems: list[str] = []
        missing = [n for n in names if n not in columns]
        if missing:
            problems.append("missing in the table: " + ", ".join(missing))
        for f, name in zip(schema, names, strict=True):
            if name not in columns:
                continue
            typname, category, shown, _notnull, _default, generated = columns[name]
            if generated:
                problems.append(f"{name} is a generated column and cannot be written")
            elif not arrowpg.accepts(f.type, typname, category):
                label = name if name == f.name else f"{f.name} -> {name}"
                problems.append(f"{label}: DataFrame type {f.type} does not fit column type "
                                f"{shown}")
        required = [n for n, (_t, _c, _s, notnull, has_default, gen) in columns.items()
                    if notnull and not has_default and not gen and n not in names]
        if required:
            problems.append("NOT NULL columns without a default not in the DataFrame: "
                            + ", ".join(required))
        for k in self.key or ():
            if k not in names:
                problems.append(f"key column {k} is not written by the DataFrame")
        for c in self.order_by or ():
            if c not in names:
                problems.append(f"order_by column {c} is not written by the DataFrame")
        if problems:
            raise SchemaMismatchError(
                f"the DataFrame does not fit table {self.table} on {self._target}: "
                + "; ".join(problems),
                fix="select/cast/rename the DataFrame's columns (or pass columns={df_name: "
                "table_name}), or alter the table; nothing was written",
            )

    def _check_unique_key(self, cur: Any) -> None:
        cur.execute(
            "SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey) k"
            " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k)"
            " FROM pg_index i WHERE i.indrelid = to_regclass(%s) AND i.indisunique"
            " AND i.indpred IS NULL AND i.indexprs IS NULL",
            (self._ident(self.table).as_string(cur.connection),),
        )
        wanted = set(self.key or ())
        if not any(set(row[0]) == wanted for row in cur.fetchall()):
            cols = ", ".join(self.key or ())
            raise SchemaMismatchError(
                f"mode='upsert' needs a unique index or primary key on ({cols}) of table "
                f"{self.table}",
                fix=f"CREATE UNIQUE INDEX ON {self.table} ({cols}); or create the table with "
                "create_table=True (the key becomes its primary key); nothing was written",
            )

    def _create_table_sql(self, schema: pa.Schema, names: tuple[str, ...]) -> Any:
        from psycopg2 import sql

        defs = []
        for f, name in zip(schema, names, strict=True):
            not_null = " NOT NULL" if not f.nullable else ""
            defs.append(sql.SQL("{} " + arrowpg.pg_type(f.type) + not_null).format(
                sql.Identifier(name)))
        if self.key:
            defs.append(sql.SQL("PRIMARY KEY ({})").format(
                sql.SQL(", ").join(sql.Identifier(k) for k in self.key)))
        return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            self._ident(self.table), sql.SQL(", ").join(defs))

    # -- phase 1, in a task ---------------------------------------------------------------------
    def begin(self, txn: Transaction) -> PgTransaction:
        gid = txn.txn_id
        if len(gid.encode()) > MAX_GID_LENGTH:
            raise ConfigurationError(
                f"transaction ID {gid!r} is longer than PostgreSQL's {MAX_GID_LENGTH} bytes",
                sink=txn.sink, batch_id=txn.batch_id, fix="use a shorter sink name",
            )
        handle = PgTransaction(txn, None, gid)
        doing = f"opening transaction {gid}"
        with self._db(doing, txn):
            if self._plain:
                lock_timeout = self._lock_timeout_sql
                handle.conn = POOL.checkout(
                    self.dsn, self.connect_timeout_s,
                    lambda conn: _execute_all(conn, "BEGIN", lock_timeout))
                return handle
            handle.conn = POOL.checkout(
                self.dsn, self.connect_timeout_s,
                lambda conn: _execute(conn, "SET application_name = %s",
                                      (prepared.session_name(txn),)))
            try:
                self._begin_on(handle)
            except BaseException:
                discard(handle.conn)
                raise
            if handle.skipped:
                self._end_session(handle)
        return handle

    def _begin_on(self, handle: PgTransaction) -> None:
        txn = handle.txn
        with handle.conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute(self._lock_timeout_sql)
            marker = self._ident(self.marker_table)
            if not (markers.claim(cur, marker, txn) if self._prepared
                    else markers.partition_committed_by(cur, marker, txn) is None):
                # Another attempt of this (batch, partition) committed: this one is a late
                # zombie or a speculative copy that lost. Nothing to write.
                handle.skipped = True
                cur.execute("ROLLBACK")
                log_event("postgres.attempt_skipped", sink=txn.sink, batch=txn.batch_id,
                          txn=txn.txn_id, detail="partition already committed by another "
                          "attempt")
                return
            if self._prepared:
                cur.execute("SELECT txid_current() % 4294967296")
                handle.xid = int(cur.fetchone()[0])

    def _end_session(self, handle: PgTransaction) -> None:
        """Hand an idle connection back to the pool under the neutral session name."""
        conn, handle.conn = handle.conn, None
        if conn is None:
            return
        try:
            _execute(conn, "RESET application_name")
        except Exception:
            discard(conn)
            return
        POOL.release(self.dsn, conn)

    def write(self, handle: PgTransaction, batch: pa.RecordBatch) -> None:
        from psycopg2 import sql

        txn = handle.txn
        if handle.skipped:
            return
        with self._db(f"writing {batch.num_rows} rows", txn):
            if handle.columns is None:
                handle.columns = self._target_names(batch.schema)
            cols = sql.SQL(", ").join(sql.Identifier(c) for c in handle.columns)
            with handle.conn.cursor() as cur:
                if self.mode == "upsert":
                    target = self._stage_ident(handle)
                    if not handle.staged:
                        self._create_stage(cur, handle, target, cols)
                        handle.staged = True
                else:
                    target = self._ident(self.table)
                copy = sql.SQL("COPY {t} ({c}) FROM STDIN WITH (" + arrowpg.COPY_OPTIONS + ")"
                               ).format(t=target, c=cols).as_string(handle.conn)
                payload = arrowpg.csv_payload(batch)
                cur.copy_expert(copy, pa.BufferReader(payload), size=1 << 20)
            handle.rows += batch.num_rows

    def prepare(self, handle: PgTransaction) -> Receipt:
        from psycopg2 import sql

        txn = handle.txn
        if handle.skipped:
            return {"gid": handle.gid, "rows": 0, "skipped": True}
        try:
            with self._db(f"preparing transaction {handle.gid}", txn), \
                    handle.conn.cursor() as cur:
                if handle.staged:
                    self._refuse_repeated_keys(cur, handle)
                if self._plain and handle.staged:
                    assert handle.columns is not None and self.key
                    cur.execute(upsert.upsert_sql(
                        self._ident(self.table), sql.Identifier(STAGE_TABLE), handle.columns,
                        self.key, self.order_by or ()))
                if self._prepared:
                    cur.execute("PREPARE TRANSACTION %s", (handle.gid,))
                else:
                    cur.execute("COMMIT")
                if not self._plain:
                    cur.execute("RESET application_name")
        except BaseException:
            discard(handle.conn)
            raise
        POOL.release(self.dsn, handle.conn)
        handle.conn = None
        if self._plain:
            return {"mode": "upsert", "rows": handle.rows, "committed": True}
        if self._staged:
            return {"rows": handle.rows, "staged": handle.staged,
                    "columns": list(handle.columns or ())}
        return {"gid": handle.gid, "rows": handle.rows, "xid": handle.xid}

    def _create_stage(self, cur: Any, handle: PgTransaction, stage: Any, cols: Any) -> None:
        from psycopg2 import sql

        assert handle.columns is not None
        if self._plain:
            cur.execute(sql.SQL("CREATE TEMP TABLE {s} ON COMMIT DROP AS SELECT {c} FROM {t}"
                                " WITH NO DATA").format(s=stage, c=cols,
                                                        t=self._ident(self.table)))
            return
        try:
            upsert.create_stage(cur, stage, self._ident(self.table), handle.columns)
        except Exception as exc:
            if pg_code(exc) != DUPLICATE_TABLE:
                raise
            txn = handle.txn
            raise AttemptFencedError(
                f"the stage table of {txn.txn_id} exists already: another attempt with "
                "the same ID (a zombie of a retried stage) holds it; this one writes "
                "nothing", sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
                fix="none needed: Spark retries the task under the next attempt number",
            ) from exc

    def _refuse_repeated_keys(self, cur: Any, handle: PgTransaction) -> None:
        """Without ``order_by`` nothing says which row of a repeated key is the latest
        (arrival order is not stable across task attempts): refuse the batch."""
        if self.order_by:
            return
        assert self.key
        found = upsert.repeated_key(cur, self._stage_ident(handle), self.key)
        if found is None:
            return
        values, times = found
        txn = handle.txn
        shown = ", ".join(f"{k}={v!r}" for k, v in zip(self.key, values, strict=True))
        raise DataRejectedError(
            f"key ({shown}) appears {times} times in batch {txn.batch_id}: mode='upsert' "
            f"writes one row per key of {self.table}, and nothing says which of them is the "
            "latest; every transaction of the batch is rolled back",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="pass order_by=['<column>'] (the row with the greatest value is written, "
            "e.g. an event time or version), or deduplicate the batch by key before the "
            "sink (e.g. an aggregation), then restart the query",
        )

    def _stage_ident(self, handle: PgTransaction) -> Any:
        from psycopg2 import sql

        if self._plain:
            return sql.Identifier(STAGE_TABLE)
        return upsert.stage_ident(self._ident(self.marker_table), handle.gid)

    def abort(self, handle: PgTransaction, txn: Transaction) -> None:
        """This attempt's own session only: an open transaction is rolled back; one this
        attempt already prepared is rolled back by its gid (never another attempt's)."""
        conn, handle.conn = handle.conn, None
        if conn is not None:
            try:
                _execute(conn, "ROLLBACK")
            except Exception:
                discard(conn)  # closing the session rolls the transaction back as well
            else:
                if not self._plain:
                    with contextlib.suppress(Exception):
                        _execute(conn, "RESET application_name")
                POOL.release(self.dsn, conn)
        elif not self._plain and not handle.skipped:
            self.rollback(txn)

    # -- phase 2 and recovery -------------------------------------------------------------------
    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        if self._plain or receipt.get("committed"):
            return  # committed by the task itself
        if receipt.get("skipped"):
            # The attempt found its (batch, partition) committed by another (a replay
            # under at_least_once): it wrote nothing, there is nothing to commit.
            return
        if self._staged:
            if receipt.get("staged"):
                with self._db(f"applying the upserts of {txn.txn_id}", txn, phase="commit"):
                    POOL.run(self.dsn, self.connect_timeout_s,
                             lambda conn: self._publish_on(conn, txn, receipt["columns"]))
        else:
            gid = txn.txn_id
            xid = receipt.get("xid")
            with self._db(f"committing prepared transaction {gid}", txn, phase="commit"):
                POOL.run(self.dsn, self.connect_timeout_s,
                         lambda conn: self._commit_on(conn, txn, gid,
                                                      None if xid is None else int(xid)))
        if txn.partition == 0:
            marker, timeout = self._ident(self.marker_table), self._lock_timeout_sql
            POOL.run(self.dsn, self.connect_timeout_s, lambda conn: markers.purge(
                conn, marker, txn, self.marker_retention, timeout))

    def _commit_on(self, conn: Any, txn: Transaction, gid: str, xid: int | None) -> None:
        row = prepared.prepared_xid(conn, txn, gid, self._target)
        commit_step("looked_up", txn)
        if row is not None:
            if xid is None or row == xid:
                try:
                    _execute(conn, "COMMIT PREPARED %s", (gid,))
                    commit_step("committed", txn)
                    return
                except Exception as exc:
                    if pg_code(exc) == OBJECT_IN_USE:
                        # A twin commit (the driver and `recover --force`) is finishing
                        # this gid right now: wait until it is done, then ask the marker.
                        prepared.wait_until_resolved(conn, gid, self.lock_timeout_s)
                    elif pg_code(exc) != UNDEFINED_OBJECT:
                        raise
                    # gone between the look-up and the commit: decide by the marker
            else:
                # Not the transaction the decision names (xid differs): someone prepared
                # a transaction under this attempt's gid by hand. It must never commit.
                log_event("postgres.foreign_prepared", logging.WARNING, sink=txn.sink,
                          batch=txn.batch_id, txn=gid, expected_xid=xid, found_xid=row)
                prepared.rollback_prepared(conn, txn, gid, reason="not the decided attempt")
        committed = markers.committed_txn(conn, self._ident(self.marker_table), txn)
        if committed == gid:
            log_event("postgres.already_committed", sink=txn.sink, batch=txn.batch_id, txn=gid)
            return
        if committed is not None:
            raise self._collision(txn, committed)
        raise DataLossError(
            f"prepared transaction {gid} of decided batch {txn.batch_id} (partition "
            f"{txn.partition}) no longer exists on {self._target}, and its marker row is not "
            f"in {self.marker_table}: its rows were never committed. Someone ran ROLLBACK "
            "PREPARED on it, or the database was restored or recreated after the prepare",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=gid,
            fix=f"the rows of batch {txn.batch_id} partition {txn.partition} are missing from "
            f"{self.table}; re-process that batch from the source (e.g. restart the query "
            "from a copy of the checkpoint taken before it, into a clean table), then move "
            "this sink's commit log aside. The query refuses to continue until then",
        )

    def _publish_on(self, conn: Any, txn: Transaction, columns: Sequence[str]) -> None:
        assert self.key
        marker = self._ident(self.marker_table)
        outcome = upsert.publish(conn, txn, marker, self._ident(self.table), columns,
                                 self.key, self.order_by or (), self._lock_timeout_sql)
        if outcome == "already":
            log_event("postgres.already_committed", sink=txn.sink, batch=txn.batch_id,
                      txn=txn.txn_id)
        elif outcome.startswith("other:"):
            raise self._collision(txn, outcome.split(":", 1)[1])
        elif outcome == "missing":
            raise DataLossError(
                f"the stage table of {txn.txn_id} (decided batch {txn.batch_id}, partition "
                f"{txn.partition}) no longer exists on {self._target}, and its marker row is "
                f"not in {self.marker_table}: its upserts were never applied. Someone "
                f"dropped {upsert.stage_name(txn.txn_id)}, or the database was restored",
                sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
                fix=f"the upserts of batch {txn.batch_id} partition {txn.partition} are "
                f"missing from {self.table}; re-process that batch from the source, then "
                "move this sink's commit log aside. The query refuses to continue until then",
            )

    def _collision(self, txn: Transaction, committed: str) -> TransactionIdCollisionError:
        return TransactionIdCollisionError(
            f"batch {txn.batch_id} partition {txn.partition} was committed by "
            f"{committed}, not by {txn.txn_id}, the attempt the batch decided: two writers "
            f"share this sink's query key and name in {self.marker_table}",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="give each query its own checkpointLocation and each sink of a query "
            "its own name; check the table for rows this batch wrote twice",
        )

    def rollback(self, txn: Transaction) -> None:
        if self._plain:
            return  # tasks commit their own plain transactions; nothing is ever staged
        with self._db(f"rolling back transaction {txn.txn_id}", txn, phase="rollback"):
            POOL.run(self.dsn, self.connect_timeout_s, lambda conn: self._rollback_on(conn, txn))

    def _rollback_on(self, conn: Any, txn: Transaction) -> None:
        prepared.terminate_sessions(conn, [prepared.session_name(txn)], txn)
        if self._staged:
            upsert.drop_stages(conn, self._ident(self.marker_table), [txn.txn_id])
        else:
            prepared.rollback_prepared(conn, txn, txn.txn_id, reason="rollback")

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        """One query for this sink's sessions, one for its prepared transactions (or
        stage tables)."""
        if self._plain or not ranges:
            return
        with self._db(f"rolling back attempts of batches "
                      f"{sorted({r.batch_id for r in ranges})}", phase="rollback"):
            POOL.run(self.dsn, self.connect_timeout_s,
                     lambda conn: self._sweep_on(conn, ranges, keep))

    def _sweep_on(self, conn: Any, ranges: Sequence[AttemptRange],
                  keep: frozenset[str]) -> None:
        prepared.sweep(conn, ranges, keep)  # sessions first: no stage appears afterwards
        if self._staged:
            marker = self._ident(self.marker_table)
            doomed = [t.txn_id for r in ranges for t in r.transactions()
                      if t.txn_id not in keep]
            upsert.drop_stages(conn, marker, upsert.existing_stages(conn, marker, doomed))

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        if self.mode == "upsert":
            return None  # upserts rewrite the same rows: a replay is harmless
        marker, table = self._ident(self.marker_table), self._ident(self.table)
        with self._db("looking for this sink's output from other queries", phase="setup"):
            return POOL.run(self.dsn, self.connect_timeout_s,
                            lambda conn: markers.other_queries(conn, marker, query_key, sink,
                                                               table))

    def probe(self, txn: Transaction) -> TxnState:
        if self._plain:
            return TxnState.UNKNOWN
        with self._db(f"probing transaction {txn.txn_id}", txn, phase="probe"):
            return POOL.run(self.dsn, self.connect_timeout_s,
                            lambda conn: self._probe_on(conn, txn))

    def _probe_on(self, conn: Any, txn: Transaction) -> TxnState:
        if self._staged:
            if upsert.existing_stages(conn, self._ident(self.marker_table), [txn.txn_id]):
                return TxnState.PREPARED
        elif prepared.prepared_xid(conn, txn, txn.txn_id, self._target) is not None:
            return TxnState.PREPARED
        if markers.committed_txn(conn, self._ident(self.marker_table), txn) == txn.txn_id:
            return TxnState.COMMITTED
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                        " AND pid <> pg_backend_pid()", (prepared.session_name(txn),))
            if cur.fetchone()[0]:
                return TxnState.OPEN
        return TxnState.ABSENT

    def close(self) -> None:
        POOL.close_dsn(self.dsn)

    # -- helpers ---------------------------------------------------------------------------------
    @property
    def _lock_timeout_sql(self) -> str:
        return f"SET LOCAL lock_timeout = '{max(1, int(self.lock_timeout_s * 1000))}ms'"

    @property
    def _target(self) -> str:
        return dsn_mod.target(self.dsn)

    @contextlib.contextmanager
    def _db(self, doing: str, txn: Transaction | None = None,
            phase: str = "write") -> Iterator[None]:
        """The one place database errors become sparkeos errors."""
        try:
            yield
        except Exception as exc:
            translated = translate_error(
                exc, doing=doing, target=self._target, phase=phase,
                sink=txn.sink if txn else None, batch_id=txn.batch_id if txn else None,
                txn_id=txn.txn_id if txn else None,
            )
            if translated is exc:
                raise
            if pg_code(exc) == OUT_OF_MEMORY and txn is not None:
                translated = self._pool_full_error(txn, translated)
            raise translated from exc

    def _pool_full_error(self, txn: Transaction, error: Any) -> Any:
        """Say who holds the prepared-transaction slots, and how to free orphans."""
        prefix = TransactionPool(txn.query_key, txn.sink).prefix
        try:
            usage = POOL.run(self.dsn, self.connect_timeout_s,
                             lambda conn: prepared.usage(conn, prefix))
        except Exception:
            return error  # the plain advice is still right
        return prepared_limit_error(
            usage.limit, sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            target=self._target, usage=usage.describe(prefix))

    def _ident(self, name: str) -> Any:
        from psycopg2 import sql

        return sql.Identifier(*_split_name(name, "table"))

    def _target_names(self, schema: pa.Schema) -> tuple[str, ...]:
        mapping = dict(self.columns or {})
        unknown = sorted(set(mapping) - set(schema.names))
        if unknown:
            raise SchemaMismatchError(
                f"columns= maps {', '.join(unknown)}, not in the DataFrame (which has "
                f"{', '.join(schema.names)})",
                fix="map only columns the DataFrame has; nothing was written",
            )
        names = tuple(mapping.get(n, n) for n in schema.names)
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SchemaMismatchError(f"two DataFrame columns go to table column(s) "
                                      f"{', '.join(dupes)}",
                                      fix="rename or drop one of them; nothing was written")
        unsupported = [f"{f.name}: {f.type}" for f in schema if not arrowpg.supported(f.type)]
        if unsupported:
            raise SchemaMismatchError(
                "column types PostgresSink cannot write: " + ", ".join(unsupported),
                fix="cast them (e.g. to string) before the sink; nothing was written",
            )
        return names


def _split_name(name: str, what: str) -> tuple[str, ...]:
    parts = tuple(name.split(".")) if isinstance(name, str) else ()
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise ConfigurationError(
            f"{what}={name!r}: give 'name' or 'schema.name'",
            fix=f"{what}='orders' or {what}='sales.orders' (taken literally, case-sensitive)",
        )
    return parts


def _execute(conn: Any, statement: str, params: tuple[Any, ...] | None = None) -> None:
    with conn.cursor() as cur:
        cur.execute(statement, params)


def _execute_all(conn: Any, *statements: str) -> None:
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
