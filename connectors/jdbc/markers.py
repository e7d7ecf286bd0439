"""Marker rows: one per committed (query, sink, batch, partition), in the same
transaction as the data.

A marker tells a commit that finds its gid gone whether the transaction committed
(a marker names it) or was lost (no marker). Markers are keyed by the attempt's
transaction ID too, so concurrent attempts of one partition (a retry beside a dead
attempt's prepared transaction, a speculative copy) never wait for each other on the
marker; an attempt that begins after another attempt committed its partition sees
that marker and writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from sparkeos.core.observe import log_event
from sparkeos.core.txpool import Transaction

from .errors import MARKER_KEY_SUFFIX

COMMENT = ("sparkeos: one row per committed (query, sink, batch, partition) of an "
           "exactly-once PostgresSink, written in the same transaction as the data; "
           "do not edit")


def ensure_table(cur: Any, marker: Any) -> None:
    """Create the marker table (``marker`` is a psycopg2 ``sql.Identifier``)."""
    from psycopg2 import sql

    cur.execute("SELECT to_regclass(%s)", (marker.as_string(cur.connection),))
    if cur.fetchone()[0] is not None:
        return
    key = sql.Identifier(f"{marker.strings[-1][:40]}{MARKER_KEY_SUFFIX}")
    cur.execute(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {m} ("
        " query_key text NOT NULL, sink text NOT NULL,"
        " batch_id bigint NOT NULL, \"partition\" integer NOT NULL,"
        " txn_id text NOT NULL, attempt text NOT NULL DEFAULT '',"
        " committed_at timestamptz NOT NULL DEFAULT now(),"
        " CONSTRAINT {k} PRIMARY KEY (query_key, sink, batch_id, \"partition\", txn_id))"
    ).format(m=marker, k=key))
    cur.execute(sql.SQL("COMMENT ON TABLE {m} IS %s").format(m=marker), (COMMENT,))


def claim(cur: Any, marker: Any, txn: Transaction) -> bool:
    """Insert ``txn``'s marker in its open transaction, unless another attempt already
    committed this (batch, partition): then False, and the attempt writes nothing."""
    if partition_committed_by(cur, marker, txn) is not None:
        return False
    insert(cur, marker, txn)
    return True


def insert(cur: Any, marker: Any, txn: Transaction) -> None:
    """Insert ``txn``'s marker row in the open transaction."""
    from psycopg2 import sql

    cur.execute(sql.SQL(
        "INSERT INTO {m} (query_key, sink, batch_id, \"partition\", txn_id, attempt,"
        " committed_at) VALUES (%s, %s, %s, %s, %s, %s, now())"
    ).format(m=marker), (txn.query_key, txn.sink, txn.batch_id, txn.partition, txn.txn_id,
                         txn.attempt))


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
    """The transaction ID that committed ``txn``'s (batch, partition), if any."""
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
