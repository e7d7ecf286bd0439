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

``mode="upsert"`` is at-least-once and idempotent instead: each task COPYs into a
temporary table and runs ``INSERT ... SELECT ... ON CONFLICT (key) DO UPDATE`` in one
ordinary transaction; a replayed batch overwrites the same rows. No prepared
transactions, no marker rows.

Other databases: ``dsn`` also takes an SQLAlchemy URL or engine for PostgreSQL. A sink
for another database with two-phase commit follows this file with SQLAlchemy's API in
place of the SQL statements: ``conn.begin_twophase(gid)`` in ``begin``, ``tx.prepare()``
in ``prepare``, ``conn.commit_prepared(gid, recover=True)`` in ``commit``,
``conn.rollback_prepared(gid, recover=True)`` in ``rollback`` and
``conn.recover_twophase()`` in ``probe``; the marker-row logic stays as it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkeos.core.config import Guarantee
from sparkeos.core.errors import (
    ConfigurationError,
    DataLossError,
    SchemaMismatchError,
    TransactionIdCollisionError,
)
from sparkeos.core.observe import log_event
from sparkeos.core.protocol import Receipt, Transaction, TransactionalSink, TxnState
from sparkeos.core.txpool import AttemptRange, TransactionPool

from . import arrowpg, markers, prepared
from . import dsn as dsn_mod
from .connections import POOL, discard
from .errors import (
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
STAGE_SEQ = "__sparkeos_seq"
DSN_ENV = "SPARKEOS_POSTGRES_DSN"

# (dsn, table, ..., schema) -> when the check expires; validate runs before every batch on
# the driver, and the catalog rarely changes under a running query.
_VALIDATED: dict[tuple[Any, ...], float] = {}
VALIDATION_TTL_S = 300.0


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
    ``mode``: ``"transactional"`` (two-phase commit, exactly-once) or ``"upsert"``
    (at-least-once, idempotent ``INSERT ... ON CONFLICT (key) DO UPDATE``).
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
        return hash((self.dsn, self.table, self.mode, self.marker_table))

    # -- what the coordinator reads -------------------------------------------------------
    @property  # a property: the guarantee depends on the mode
    def guarantees(self) -> frozenset[Guarantee]:  # type: ignore[override]
        if self.mode == "upsert":
            return frozenset({Guarantee.AT_LEAST_ONCE, Guarantee.NONE})
        return frozenset(Guarantee)

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
        cache_key = (self.dsn, self.table, self.mode, self.key, self.marker_table,
                     self.create_table, names,
                     tuple((f.name, str(f.type), f.nullable) for f in schema))
        if _VALIDATED.get(cache_key, 0.0) > time.monotonic():
            return
        with self._db("checking the destination table", phase="setup"):
            POOL.run(self.dsn, self.connect_timeout_s,
                     lambda conn: self._validate_on(conn, schema, names))
        _VALIDATED[cache_key] = time.monotonic() + VALIDATION_TTL_S

    def _validate_on(self, conn: Any, schema: pa.Schema, names: tuple[str, ...]) -> None:

        with conn.cursor() as cur:
            if self.mode == "transactional":
                cur.execute("SHOW max_prepared_transactions")
                limit = int(cur.fetchone()[0])
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
            else:
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
            if self.mode == "upsert":
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
            if not markers.claim(cur, self._ident(self.marker_table), txn):
                # Another attempt of this (batch, partition) committed: this one is a late
                # zombie or a speculative copy that lost. Nothing to write.
                handle.skipped = True
                cur.execute("ROLLBACK")
                log_event("postgres.attempt_skipped", sink=txn.sink, batch=txn.batch_id,
                          txn=txn.txn_id, detail="partition already committed by another "
                          "attempt")
                return
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
                    if not handle.staged:
                        cur.execute(sql.SQL(
                            "CREATE TEMP TABLE {s} ON COMMIT DROP AS SELECT {c} FROM {t} "
                            "WITH NO DATA").format(s=sql.Identifier(STAGE_TABLE), c=cols,
                                                   t=self._ident(self.table)))
                        cur.execute(sql.SQL("ALTER TABLE {s} ADD COLUMN {q} bigserial").format(
                            s=sql.Identifier(STAGE_TABLE), q=sql.Identifier(STAGE_SEQ)))
                        handle.staged = True
                    target = sql.Identifier(STAGE_TABLE)
                else:
                    target = self._ident(self.table)
                copy = sql.SQL("COPY {t} ({c}) FROM STDIN WITH (" + arrowpg.COPY_OPTIONS + ")"
                               ).format(t=target, c=cols).as_string(handle.conn)
                payload = arrowpg.csv_payload(batch)
                cur.copy_expert(copy, pa.BufferReader(payload), size=1 << 20)
            handle.rows += batch.num_rows

    def prepare(self, handle: PgTransaction) -> Receipt:
        txn = handle.txn
        if handle.skipped:
            return {"gid": handle.gid, "rows": 0, "skipped": True}
        try:
            with self._db(f"preparing transaction {handle.gid}", txn), \
                    handle.conn.cursor() as cur:
                if self.mode == "upsert":
                    if handle.staged:
                        cur.execute(self._upsert_sql(handle))
                    cur.execute("COMMIT")
                else:
                    markers.purge(cur, self._ident(self.marker_table), txn,
                                  self.marker_retention)
                    cur.execute("PREPARE TRANSACTION %s", (handle.gid,))
                    cur.execute("RESET application_name")
        except BaseException:
            discard(handle.conn)
            raise
        POOL.release(self.dsn, handle.conn)
        handle.conn = None
        if self.mode == "upsert":
            return {"mode": "upsert", "rows": handle.rows, "committed": True}
        return {"gid": handle.gid, "rows": handle.rows, "xid": handle.xid}

    def _upsert_sql(self, handle: PgTransaction) -> Any:
        from psycopg2 import sql

        assert handle.columns is not None and self.key
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in handle.columns)
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in self.key)
        others = [c for c in handle.columns if c not in self.key]
        if others:
            action = sql.SQL("DO UPDATE SET ") + sql.SQL(", ").join(
                sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in others)
        else:
            action = sql.SQL("DO NOTHING")
        # DISTINCT ON: the last row of a key within the batch wins (ON CONFLICT cannot
        # touch a row twice in one statement).
        return sql.SQL(
            "INSERT INTO {t} ({c}) SELECT DISTINCT ON ({k}) {c} FROM {s}"
            " ORDER BY {k}, {q} DESC ON CONFLICT ({k}) {a}"
        ).format(t=self._ident(self.table), c=cols, k=keys, s=sql.Identifier(STAGE_TABLE),
                 q=sql.Identifier(STAGE_SEQ), a=action)

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
                if self.mode == "transactional":
                    with contextlib.suppress(Exception):
                        _execute(conn, "RESET application_name")
                POOL.release(self.dsn, conn)
        elif self.mode == "transactional" and not handle.skipped:
            self.rollback(txn)

    # -- phase 2 and recovery -------------------------------------------------------------------
    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        if self.mode == "upsert" or receipt.get("committed"):
            return  # committed by the task itself
        gid = txn.txn_id
        xid = receipt.get("xid")
        with self._db(f"committing prepared transaction {gid}", txn, phase="commit"):
            POOL.run(self.dsn, self.connect_timeout_s,
                     lambda conn: self._commit_on(conn, txn, gid,
                                                  None if xid is None else int(xid)))

    def _commit_on(self, conn: Any, txn: Transaction, gid: str, xid: int | None) -> None:
        row = prepared.prepared_xid(conn, txn, gid, self._target)
        if row is not None:
            if xid is None or row == xid:
                try:
                    _execute(conn, "COMMIT PREPARED %s", (gid,))
                    return
                except Exception as exc:
                    if pg_code(exc) != UNDEFINED_OBJECT:
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
            raise TransactionIdCollisionError(
                f"batch {txn.batch_id} partition {txn.partition} was committed by "
                f"{committed}, not by {gid}, the attempt the batch decided: two writers "
                f"share this sink's query key and name in {self.marker_table}",
                sink=txn.sink, batch_id=txn.batch_id, txn_id=gid,
                fix="give each query its own checkpointLocation and each sink of a query "
                "its own name; check the table for rows this batch wrote twice",
            )
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

    def rollback(self, txn: Transaction) -> None:
        if self.mode == "upsert":
            return  # tasks commit their own plain transactions; nothing is ever prepared
        with self._db(f"rolling back transaction {txn.txn_id}", txn, phase="rollback"):
            POOL.run(self.dsn, self.connect_timeout_s, lambda conn: self._rollback_on(conn, txn))

    def _rollback_on(self, conn: Any, txn: Transaction) -> None:
        prepared.terminate_sessions(conn, [prepared.session_name(txn)], txn)
        prepared.rollback_prepared(conn, txn, txn.txn_id, reason="rollback")

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        """One query for this sink's sessions, one for its prepared transactions."""
        if self.mode == "upsert" or not ranges:
            return
        with self._db(f"rolling back attempts of batches "
                      f"{sorted({r.batch_id for r in ranges})}", phase="rollback"):
            POOL.run(self.dsn, self.connect_timeout_s,
                     lambda conn: prepared.sweep(conn, ranges, keep))

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        if self.mode == "upsert":
            return None  # upserts rewrite the same rows: a replay is harmless
        marker, table = self._ident(self.marker_table), self._ident(self.table)
        with self._db("looking for this sink's output from other queries", phase="setup"):
            return POOL.run(self.dsn, self.connect_timeout_s,
                            lambda conn: markers.other_queries(conn, marker, query_key, sink,
                                                               table))

    def probe(self, txn: Transaction) -> TxnState:
        if self.mode == "upsert":
            return TxnState.UNKNOWN
        with self._db(f"probing transaction {txn.txn_id}", txn, phase="probe"):
            return POOL.run(self.dsn, self.connect_timeout_s,
                            lambda conn: self._probe_on(conn, txn))

    def _probe_on(self, conn: Any, txn: Transaction) -> TxnState:
        if prepared.prepared_xid(conn, txn, txn.txn_id, self._target) is not None:
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
