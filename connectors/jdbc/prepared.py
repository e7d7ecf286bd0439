"""Prepared transactions and the sessions that write them.

Every task attempt writes in its own session and prepares under its own gid (the
attempt's transaction ID). The session's ``application_name`` names the attempt in a
form that fits PostgreSQL's 63 bytes and can be read back, so a sweep finds the open
sessions and prepared transactions of this sink with one query each and never touches
another attempt's, another sink's or another query's.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkeos.core.errors import RetriableError, TransactionIdCollisionError
from sparkeos.core.observe import log_event
from sparkeos.core.snapshot.txpool import AttemptRange, Transaction, TransactionPool

from .errors import INSUFFICIENT_PRIVILEGE, UNDEFINED_OBJECT, pg_code

_SESSION = re.compile(r"(\d+)-(\d+)-(\d+)-(\d+)")


def _session_prefix(query_key: str, sink: str) -> str:
    return f"seos-{query_key}-{hashlib.sha256(sink.encode()).hexdigest()[:8]}-"


def session_name(txn: Transaction) -> str:
    """``application_name`` of the session writing ``txn`` (readable back by the sweep)."""
    return (f"{_session_prefix(txn.query_key, txn.sink)}"
            f"{txn.partition}-{txn.batch_id}-{txn.run}-{txn.tag}")


def participant_session_prefix(txn: Transaction) -> str:
    """What the session names of every attempt of ``txn``'s partition begin with."""
    return f"{_session_prefix(txn.query_key, txn.sink)}{txn.partition}-"


def _session_txn(pool: TransactionPool, name: str) -> Transaction | None:
    prefix = _session_prefix(pool.query_key, pool.sink)
    match = _SESSION.fullmatch(name[len(prefix):]) if name.startswith(prefix) else None
    if match is None:
        return None
    partition, batch_id, run, tag = (int(g) for g in match.groups())
    return pool.transaction(batch_id, partition, run, tag)


def prepared_xid(conn: Any, txn: Transaction, gid: str, target: str) -> int | None:
    """The xid of the prepared transaction ``gid`` in this database, else None.

    Looks up this exact gid only (never scans by prefix)."""
    with conn.cursor() as cur:
        cur.execute("SELECT transaction::text::bigint, database = current_database(),"
                    " database FROM pg_prepared_xacts WHERE gid = %s", (gid,))
        row = cur.fetchone()
    if row is None:
        return None
    if not row[1]:
        raise TransactionIdCollisionError(
            f"a prepared transaction named {gid} exists in database {row[2]!r}, not in "
            f"the sink's database on {target}: another query or an earlier "
            "configuration of this sink wrote to the same server under the same name",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=gid,
            fix=f"if nothing needs it, run ROLLBACK PREPARED '{gid}' while connected to "
            f"database {row[2]!r}; or give this sink another name",
        )
    return int(row[0])


def wait_until_resolved(conn: Any, gid: str, timeout_s: float) -> None:
    """Wait while another session finishes ``gid`` (COMMIT or ROLLBACK PREPARED answered
    "busy"): until it is gone from ``pg_prepared_xacts``, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (gid,))
            if cur.fetchone() is None:
                return
        if time.monotonic() > deadline:
            raise RetriableError(
                f"prepared transaction {gid} stayed busy for {timeout_s:.0f} s: another "
                "session holds it (a second committer of the same batch)",
                txn_id=gid, fix="restart the query or run `sparkeos recover`: the batch is "
                "decided and is committed then")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def rollback_prepared(conn: Any, txn: Transaction, gid: str, reason: str) -> bool:
    """ROLLBACK PREPARED ``gid`` if it exists; False if there was nothing to undo."""
    try:
        with conn.cursor() as cur:
            cur.execute("ROLLBACK PREPARED %s", (gid,))
    except Exception as exc:
        if pg_code(exc) == UNDEFINED_OBJECT:
            return False  # never prepared, or resolved by someone else in between
        raise
    log_event("postgres.rolled_back", sink=txn.sink, batch=txn.batch_id, txn=gid,
              reason=reason)
    return True


def terminate_sessions(conn: Any, names: Sequence[str], txn: Transaction | None) -> list[int]:
    """End the sessions named ``names`` (attempts still writing): they can never prepare
    after this returns (PostgreSQL 14+ waits for them to exit)."""
    if not names:
        return []
    wait = ", 10000" if conn.server_version >= 140000 else ""
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT pid, pg_terminate_backend(pid{wait}) FROM pg_stat_activity"
                        " WHERE application_name = ANY(%s) AND pid <> pg_backend_pid()",
                        (list(names),))
            ended = [r[0] for r in cur.fetchall()]
    except Exception as exc:
        if pg_code(exc) != INSUFFICIENT_PRIVILEGE:
            raise
        return []  # the marker row lock still serialises the attempts
    if ended:
        log_event("postgres.fenced", logging.WARNING,
                  sink=txn.sink if txn else None, batch=txn.batch_id if txn else None,
                  txn=txn.txn_id if txn else None,
                  detail=f"terminated sessions {ended} of attempts that can never commit")
    return ended


def sweep(conn: Any, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> int:
    """End the sessions and roll back the prepared transactions of every attempt that
    ``ranges`` cover and ``keep`` does not name; returns how many were rolled back."""
    pool = TransactionPool(ranges[0].query_key, ranges[0].sink)

    def doomed(txn: Transaction | None) -> bool:
        return (txn is not None and txn.txn_id not in keep
                and any(r.covers(txn) for r in ranges))

    prefix = _session_prefix(pool.query_key, pool.sink)
    with conn.cursor() as cur:
        cur.execute("SELECT DISTINCT application_name FROM pg_stat_activity"
                    " WHERE left(application_name, %s) = %s", (len(prefix), prefix))
        sessions = [name for (name,) in cur.fetchall() if doomed(_session_txn(pool, name))]
        terminate_sessions(conn, sessions, None)
        cur.execute("SELECT gid FROM pg_prepared_xacts WHERE left(gid, %s) = %s"
                    " AND database = current_database()", (len(pool.prefix), pool.prefix))
        gids = [gid for (gid,) in cur.fetchall()]
    rolled_back = 0
    for gid in gids:
        txn = pool.parse(gid)
        if txn is not None and doomed(txn):
            rolled_back += rollback_prepared(conn, txn, gid, "sweep")
    return rolled_back


@dataclass(frozen=True)
class SlotUsage:
    """Who holds the server's prepared-transaction slots."""

    limit: int
    total: int
    mine: int
    others: list[tuple[str, str, str]]  # (gid, database, prepared at), oldest first

    def describe(self, prefix: str) -> str:
        held = (f"{self.total} of max_prepared_transactions = {self.limit} are in use: "
                f"{self.mine} by this sink (gids starting {prefix}), "
                f"{self.total - self.mine} by others")
        if self.others:
            oldest = "; ".join(f"{gid} in {db} since {at}" for gid, db, at in self.others)
            held += f" (oldest: {oldest})"
        return held


def usage(conn: Any, prefix: str) -> SlotUsage:
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('max_prepared_transactions')::int,"
                    " count(*), count(*) FILTER (WHERE left(gid, %s) = %s)"
                    " FROM pg_prepared_xacts", (len(prefix), prefix))
        limit, total, mine = cur.fetchone()
        cur.execute("SELECT gid, database, prepared::text FROM pg_prepared_xacts"
                    " WHERE left(gid, %s) <> %s ORDER BY prepared LIMIT 3",
                    (len(prefix), prefix))
        others = [(str(g), str(d), str(p)) for g, d, p in cur.fetchall()]
    return SlotUsage(int(limit), int(total), int(mine), others)
