"""Phase 1 in a Spark task: the attempt's session, the COPY of its rows, and its end.

``open_session`` checks out a connection named after the attempt and BEGINs. ``copy_rows``
COPYs each Arrow batch as CSV into the table, or into the attempt's stage table for
upserts, and fingerprints it (``core.snapshot.fingerprint``). ``finish`` ends phase 1: it reads
the markers of the attempt's (batch, partition); if an earlier transaction committed
exactly these rows there (a replay of a batch partitioned as before) it rolls back and
writes nothing (``core.snapshot.replay``); otherwise PREPARE TRANSACTION with the attempt's
marker row (appends), COMMIT with the marker row (at-least-once appends), COMMIT of the
stage (exactly-once upserts) or of the upsert itself (at-least-once upserts), and returns
the receipt. ``abort`` ends only this attempt's own session or prepared transaction.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.observe import log_event
from sparkeos.core.protocol import Receipt, Transaction
from sparkeos.core.snapshot.fingerprint import Fingerprint
from sparkeos.core.snapshot.replay import REPLAY_KEY, OnRecord, Replay, replay

from . import arrowpg, markers, prepared, upsert
from .config import PostgresConfig
from .connections import POOL, discard
from .database import execute, execute_all, translated

MAX_GID_LENGTH = 199
"""PostgreSQL's GIDSIZE is 200 bytes including the terminating NUL."""
STAGE_TABLE = "sparkeos_stage"
"""The temporary table an at-least-once upsert COPYs into."""


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
    """An earlier transaction committed these rows for this (batch, partition): rolled
    back at the end of phase 1, nothing written."""
    fingerprint: Fingerprint = field(default_factory=Fingerprint)


def open_session(config: PostgresConfig, txn: Transaction) -> PgTransaction:
    gid = txn.txn_id
    if len(gid.encode()) > MAX_GID_LENGTH:
        raise ConfigurationError(
            f"transaction ID {gid!r} is longer than PostgreSQL's {MAX_GID_LENGTH} bytes",
            sink=txn.sink, batch_id=txn.batch_id, fix="use a shorter sink name",
        )
    handle = PgTransaction(txn, None, gid)
    with translated(config, f"opening transaction {gid}", txn):
        if config.plain_upserts:
            lock_timeout = config.lock_timeout_sql
            handle.conn = POOL.checkout(
                config.dsn, config.connect_timeout_s,
                lambda conn: execute_all(conn, "BEGIN", lock_timeout))
            return handle
        handle.conn = POOL.checkout(
            config.dsn, config.connect_timeout_s,
            lambda conn: execute(conn, "SET application_name = %s",
                                 (prepared.session_name(txn),)))
        try:
            _begin(config, handle)
        except BaseException:
            discard(handle.conn)
            raise
    return handle


def _begin(config: PostgresConfig, handle: PgTransaction) -> None:
    with handle.conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(config.lock_timeout_sql)
        if config.prepared_appends:
            cur.execute("SELECT txid_current() % 4294967296")
            handle.xid = int(cur.fetchone()[0])


def _end_session(config: PostgresConfig, handle: PgTransaction) -> None:
    """Hand an idle connection back to the pool under the neutral session name."""
    conn, handle.conn = handle.conn, None
    if conn is None:
        return
    try:
        execute(conn, "RESET application_name")
    except Exception:
        discard(conn)
        return
    POOL.release(config.dsn, conn)


def copy_rows(config: PostgresConfig, handle: PgTransaction, batch: pa.RecordBatch) -> None:
    from psycopg2 import sql

    if handle.skipped:
        return
    with translated(config, f"writing {batch.num_rows} rows", handle.txn):
        if handle.columns is None:
            handle.columns = config.target_names(batch.schema)
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in handle.columns)
        with handle.conn.cursor() as cur:
            if config.mode == "upsert":
                target = _stage_ident(config, handle)
                if not handle.staged:
                    _create_stage(config, cur, handle, target, cols)
                    handle.staged = True
            else:
                target = config.ident(config.table)
            copy = sql.SQL("COPY {t} ({c}) FROM STDIN WITH (" + arrowpg.COPY_OPTIONS + ")"
                           ).format(t=target, c=cols).as_string(handle.conn)
            payload = arrowpg.csv_payload(batch)
            cur.copy_expert(copy, pa.BufferReader(payload), size=1 << 20)
        handle.fingerprint.update(batch)
        handle.rows += batch.num_rows


def finish(config: PostgresConfig, handle: PgTransaction) -> Receipt:
    replay: Replay | None = None
    try:
        with translated(config, f"preparing transaction {handle.gid}", handle.txn), \
                handle.conn.cursor() as cur:
            if not config.plain_upserts:
                replay = _replay(config, cur, handle)
                if replay.skip:
                    return _skip(config, cur, handle, replay)
            if config.appends:
                markers.insert(cur, config.ident(config.marker_table), handle.txn,
                               handle.fingerprint.written())
            _end_transaction(config, cur, handle)
    except BaseException:
        # The session goes with the failure. A PREPARE TRANSACTION whose reply was lost
        # may have gone through: with no session left, ``abort`` rolls the attempt back
        # by its gid, else its prepared rows would block the retry's on every key.
        conn, handle.conn = handle.conn, None
        discard(conn)
        raise
    POOL.release(config.dsn, handle.conn)
    handle.conn = None
    if config.plain_upserts:
        return {"mode": "upsert", "rows": handle.rows, "committed": True}
    met = replay.receipt_fields() if replay else {}
    if config.staged_upserts:
        return {"rows": handle.rows, "staged": handle.staged,
                "columns": list(handle.columns or ()),
                "written": handle.fingerprint.written().as_json(), **met}
    if config.direct_appends:
        return {"gid": handle.gid, "rows": handle.rows, "committed": True, **met}
    return {"gid": handle.gid, "rows": handle.rows, "xid": handle.xid, **met}


def _replay(config: PostgresConfig, cur: Any, handle: PgTransaction) -> Replay:
    """What this attempt wrote against what committed transactions wrote for its (batch,
    partition), read in its own transaction."""
    recorded = markers.recorded(cur, config.ident(config.marker_table), handle.txn)
    return replay(handle.txn, handle.fingerprint.written(),
                  OnRecord.of_batch(handle.txn.batch_id, recorded))


def _skip(config: PostgresConfig, cur: Any, handle: PgTransaction, replay: Replay) -> Receipt:
    """The same rows were committed for this (batch, partition) before (a replay, or a
    concurrent attempt that won): roll back, write nothing."""
    txn = handle.txn
    cur.execute("ROLLBACK")
    handle.skipped = True
    log_event("postgres.attempt_skipped", sink=txn.sink, batch=txn.batch_id,
              txn=txn.txn_id, rows=handle.rows,
              detail="the same rows were committed for this (batch, partition) before")
    _end_session(config, handle)
    return {"gid": handle.gid, "rows": 0, "skipped": True, REPLAY_KEY: replay.receipt()}


def _end_transaction(config: PostgresConfig, cur: Any, handle: PgTransaction) -> None:
    from psycopg2 import sql

    if handle.staged and not config.order_by:
        assert config.key
        upsert.refuse_repeated_keys(cur, _stage_ident(config, handle), handle.txn,
                                    config.key, config.table)
    if config.plain_upserts and handle.staged:
        assert handle.columns is not None and config.key
        cur.execute(upsert.upsert_sql(
            config.ident(config.table), sql.Identifier(STAGE_TABLE), handle.columns,
            config.key, config.order_by or ()))
    if config.prepared_appends:
        cur.execute("PREPARE TRANSACTION %s", (handle.gid,))
    else:
        cur.execute("COMMIT")
    if not config.plain_upserts:
        cur.execute("RESET application_name")


def abort(config: PostgresConfig, handle: PgTransaction) -> bool:
    """End this attempt's own session: an open transaction is rolled back. False when
    there is no session left and the attempt's prepared transaction (or stage), if any,
    must be rolled back by its gid."""
    conn, handle.conn = handle.conn, None
    if conn is None:
        return False
    try:
        execute(conn, "ROLLBACK")
    except Exception:
        discard(conn)  # closing the session rolls the transaction back as well
    else:
        if not config.plain_upserts:
            with contextlib.suppress(Exception):
                execute(conn, "RESET application_name")
        POOL.release(config.dsn, conn)
    return True


def _stage_ident(config: PostgresConfig, handle: PgTransaction) -> Any:
    from psycopg2 import sql

    if config.plain_upserts:
        return sql.Identifier(STAGE_TABLE)
    return upsert.stage_ident(config.ident(config.marker_table), handle.gid)


def _create_stage(config: PostgresConfig, cur: Any, handle: PgTransaction, stage: Any,
                  cols: Any) -> None:
    from psycopg2 import sql

    assert handle.columns is not None
    if config.plain_upserts:
        cur.execute(sql.SQL("CREATE TEMP TABLE {s} ON COMMIT DROP AS SELECT {c} FROM {t}"
                            " WITH NO DATA").format(s=stage, c=cols,
                                                    t=config.ident(config.table)))
        return
    upsert.create_attempt_stage(cur, stage, config.ident(config.table), handle.columns,
                                handle.txn)
