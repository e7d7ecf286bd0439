"""Marker rows: one per committed transaction of a (query, sink, batch, partition), in
the same transaction as the data, with what it wrote (row count and fingerprint).

A marker tells a commit that finds its gid gone whether the transaction committed
(a marker names it) or was lost (no marker). Markers are keyed by the attempt's
transaction ID too, so concurrent attempts of one partition (a retry beside a dead
attempt's prepared transaction, a speculative copy) never wait for each other on the
marker. An attempt that finds its (batch, partition) committed before with the same
rows (``core.snapshot.replay``) writes nothing; one that finds other rows there (a replay
partitioned otherwise) writes its own, under a marker of its own.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from sparkeos.core.observe import log_event
from sparkeos.core.snapshot.fingerprint import Written
from sparkeos.core.snapshot.txpool import Transaction

from .errors import MARKER_KEY_SUFFIX

COMMENT = ("sparkeos: one row per committed (query, sink, batch, partition) of an "
           "exactly-once PostgresSink, written in the same transaction as the data; "
           "do not edit")


def ensure_table(cur: Any, marker: Any) -> None:
    """Create the marker table (``marker`` is a psycopg2 ``sql.Identifier``)."""
    from psycopg2 import sql

    cur.execute("SELECT to_regclass(%s)::oid", (marker.as_string(cur.connection),))
    oid = cur.fetchone()[0]
    if oid is not None:
        _add_written_columns(cur, marker, oid)
        return
    key = sql.Identifier(f"{marker.strings[-1][:40]}{MARKER_KEY_SUFFIX}")
    cur.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {m} ("
        " query_key text NOT NULL, sink text NOT NULL,"
        " batch_id bigint NOT NULL, \"partition\" integer NOT NULL,"
        " txn_id text NOT NULL, attempt text NOT NULL DEFAULT '',"
        " committed_at timestamptz NOT NULL DEFAULT now(),"
        " rows bigint, fingerprint text,"
        " CONSTRAINT {k} PRIMARY KEY (query_key, sink, batch_id, \"partition\", txn_id))"
    ).format(m=marker, k=key))
    cur.execute(sql.SQL("COMMENT ON TABLE {m} IS %s").format(m=marker), (COMMENT,))


def _add_written_columns(cur: Any, marker: Any, oid: int) -> None:
    """A marker table made before markers recorded what was written gets the two
    columns (its old rows have none, and never count as the same rows). Looked up
    first: ``ALTER TABLE`` would wait on the locks of prepared transactions."""
    from psycopg2 import sql

    cur.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = %s AND NOT attisdropped"
                " AND attname IN ('rows', 'fingerprint')", (oid,))
    if cur.fetchone()[0] == 2:
        return
    cur.execute(sql.SQL("ALTER TABLE {m} ADD COLUMN IF NOT EXISTS rows bigint,"
                        " ADD COLUMN IF NOT EXISTS fingerprint text").format(m=marker))


def recorded(cur: Any, marker: Any, txn: Transaction) -> list[Written | None]:
    """What the committed transactions of ``txn``'s (batch, partition) wrote (None for
    a marker from before fingerprints were recorded), read in the open transaction."""
    from psycopg2 import sql

    cur.execute(sql.SQL(
        "SELECT rows, fingerprint FROM {m} WHERE query_key = %s AND sink = %s"
        " AND batch_id = %s AND \"partition\" = %s").format(m=marker),
        (txn.query_key, txn.sink, txn.batch_id, txn.partition))
    return [Written.from_json({"rows": rows, "fingerprint": fingerprint})
            for rows, fingerprint in cur.fetchall()]


def insert(cur: Any, marker: Any, txn: Transaction, written: Written | None) -> None:
    """Insert ``txn``'s marker row, with what it wrote, in the open transaction."""
    from psycopg2 import sql

    cur.execute(sql.SQL(
        "INSERT INTO {m} (query_key, sink, batch_id, \"partition\", txn_id, attempt,"
        " committed_at, rows, fingerprint) VALUES (%s, %s, %s, %s, %s, %s, now(), %s, %s)"
    ).format(m=marker), (txn.query_key, txn.sink, txn.batch_id, txn.partition, txn.txn_id,
                         txn.attempt, None if written is None else written.rows,
                         None if written is None else written.fingerprint))


def has_marker(conn: Any, marker: Any, txn: Transaction) -> bool:
    """Whether ``txn`` itself committed (its own marker row exists)."""
    from psycopg2 import sql

    with conn.cursor() as cur:
        cur.execute(sql.SQL(
            "SELECT 1 FROM {m} WHERE query_key = %s AND sink = %s AND batch_id = %s"
            " AND \"partition\" = %s AND txn_id = %s").format(m=marker),
            (txn.query_key, txn.sink, txn.batch_id, txn.partition, txn.txn_id))
        return cur.fetchone() is not None


def partition_committed_by(cur: Any, marker: Any, txn: Transaction) -> str | None:
    """The transaction ID that committed ``txn``'s (batch, partition), if any."""
    from psycopg2 import sql

    cur.execute(sql.SQL(
        "SELECT txn_id FROM {m} WHERE query_key = %s AND sink = %s AND batch_id = %s"
        " AND \"partition\" = %s LIMIT 1").format(m=marker),
        (txn.query_key, txn.sink, txn.batch_id, txn.partition))
    row = cur.fetchone()
    return None if row is None else str(row[0])


def committed_txn(conn: Any, marker: Any, txn: Transaction) -> str | None:
    """``txn``'s own ID if it committed, else another transaction ID that committed
    ``txn``'s (batch, partition), if any."""
    if has_marker(conn, marker, txn):
        return txn.txn_id
    with conn.cursor() as cur:
        return partition_committed_by(cur, marker, txn)


def purge(conn: Any, marker: Any, txn: Transaction, retention: int,
          lock_timeout_sql: str) -> None:
    """Delete markers of batches older than ``retention`` batches: partition 0's commit
    does it, after the commit, in a short transaction of its own. Never inside a
    prepared transaction: its row locks would last until phase 2, and a retry of
    partition 0's task (its first attempt prepared, then its executor died) would wait
    on them until the lock timeout. Best effort: what is left is purged next batch."""
    from psycopg2 import sql

    horizon = txn.batch_id - retention
    if txn.partition != 0 or horizon <= 0:
        return
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            try:
                cur.execute(lock_timeout_sql)
                cur.execute(sql.SQL(
                    "DELETE FROM {m} WHERE query_key = %s AND sink = %s AND batch_id < %s"
                ).format(m=marker), (txn.query_key, txn.sink, horizon))
                cur.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(Exception):
                    cur.execute("ROLLBACK")
                raise
    except Exception as exc:
        log_event("postgres.marker_purge_failed", logging.WARNING, sink=txn.sink,
                  batch=txn.batch_id, cause=str(exc).strip().splitlines()[0] if str(exc)
                  else type(exc).__name__)


def other_queries(conn: Any, marker: Any, query_key: str, sink: str,
                  table: Any) -> str | None:
    """Markers of ``sink`` committed by other queries (query keys), described, if the
    target ``table`` holds rows. Marker rows do not name their table (one marker table
    serves many sinks): an empty target holds nothing another query wrote."""
    from psycopg2 import sql

    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (marker.as_string(conn),))
        if cur.fetchone()[0] is None:
            return None
        cur.execute("SELECT to_regclass(%s)", (table.as_string(conn),))
        if cur.fetchone()[0] is None:
            return None
        cur.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {t})").format(t=table))
        if not cur.fetchone()[0]:
            return None
        cur.execute(sql.SQL(
            "SELECT query_key, max(batch_id) FROM {m} WHERE sink = %s AND query_key <> %s"
            " GROUP BY query_key ORDER BY 2 DESC LIMIT 3").format(m=marker),
            (sink, query_key))
        rows = cur.fetchall()
    if not rows:
        return None
    return "marker rows of query keys " + ", ".join(
        f"{key} (batches up to {last})" for key, last in rows)
