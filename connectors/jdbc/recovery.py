"""Rolling back, sweeping and probing attempts: what the coordinator asks after a
failure, a restart or ``sparkeos recover``.

Each acts only on this sink's attempts: their sessions (found by name), their prepared
transactions (by gid) or their stage tables (by the hash of their transaction ID).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sparkeos.core.protocol import Transaction, TxnState
from sparkeos.core.snapshot.txpool import AttemptRange

from . import markers, prepared, upsert
from .config import PostgresConfig


def rollback_on(config: PostgresConfig, conn: Any, txn: Transaction) -> None:
    """End the attempt's session, then drop its stage or roll back its prepared
    transaction."""
    prepared.terminate_sessions(conn, [prepared.session_name(txn)], txn)
    if config.staged_upserts:
        upsert.drop_stages(conn, config.ident(config.marker_table), [txn.txn_id])
    else:
        prepared.rollback_prepared(conn, txn, txn.txn_id, reason="rollback")


def sweep_on(config: PostgresConfig, conn: Any, ranges: Sequence[AttemptRange],
             keep: frozenset[str]) -> None:
    """One query for this sink's sessions, one for its prepared transactions (or stage
    tables)."""
    prepared.sweep(conn, ranges, keep)  # sessions first: no stage appears afterwards
    if config.staged_upserts:
        marker = config.ident(config.marker_table)
        doomed = [t.txn_id for r in ranges for t in r.transactions()
                  if t.txn_id not in keep]
        upsert.drop_stages(conn, marker, upsert.existing_stages(conn, marker, doomed))


def probe_on(config: PostgresConfig, conn: Any, txn: Transaction) -> TxnState:
    """Prepared (a prepared transaction or a stage), committed (its marker row), open
    (its session still runs) or absent."""
    marker = config.ident(config.marker_table)
    if config.staged_upserts:
        if upsert.existing_stages(conn, marker, [txn.txn_id]):
            return TxnState.PREPARED
    elif prepared.prepared_xid(conn, txn, txn.txn_id, config.target) is not None:
        return TxnState.PREPARED
    if markers.has_marker(conn, marker, txn):
        return TxnState.COMMITTED
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                    " AND pid <> pg_backend_pid()", (prepared.session_name(txn),))
        if cur.fetchone()[0]:
            return TxnState.OPEN
    return TxnState.ABSENT
