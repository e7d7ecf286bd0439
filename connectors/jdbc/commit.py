"""Phase 2 on the driver: committing the attempt a batch decided.

Appends: ``COMMIT PREPARED '<gid>'`` after checking in ``pg_prepared_xacts`` that the
gid is the transaction the receipt names (same xid). Exactly-once upserts: the stage is
applied with the marker row in one local transaction (``upsert.publish``). Either way
PostgreSQL cannot tell a committed gid from one lost behind our back; the marker row,
committed atomically with the data, can: it names the attempt (already committed, a
no-op), another attempt (two writers share the sink's name) or nothing (the rows are
lost: ``DataLossError``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sparkeos.core.errors import DataLossError, TransactionIdCollisionError
from sparkeos.core.observe import log_event
from sparkeos.core.protocol import Receipt, Transaction
from sparkeos.core.snapshot.fingerprint import Written
from sparkeos.core.snapshot.txpool import DIRECT_RUNS, TransactionPool
from sparkeos.core.steps import commit_step

from . import database, markers, prepared, upsert
from .config import PostgresConfig
from .connections import POOL
from .database import execute
from .errors import OBJECT_IN_USE, UNDEFINED_OBJECT, pg_code


def commit_prepared(config: PostgresConfig, txn: Transaction, receipt: Receipt) -> None:
    gid = txn.txn_id
    xid = receipt.get("xid")
    database.run(config, f"committing prepared transaction {gid}",
                 lambda conn: _commit_on(config, conn, txn, gid,
                                         None if xid is None else int(xid)),
                 txn, phase="commit")


def apply_stage(config: PostgresConfig, txn: Transaction, receipt: Receipt) -> None:
    database.run(config, f"applying the upserts of {txn.txn_id}",
                 lambda conn: _publish_on(config, conn, txn, receipt["columns"],
                                          Written.from_json(receipt.get("written"))),
                 txn, phase="commit")


def purge_markers(config: PostgresConfig, txn: Transaction) -> None:
    """Marker rows past the retention go, once per batch (partition 0's commit)."""
    if txn.partition != 0:
        return
    marker, timeout = config.ident(config.marker_table), config.lock_timeout_sql
    POOL.run(config.dsn, config.connect_timeout_s, lambda conn: markers.purge(
        conn, marker, txn, config.marker_retention, timeout))


def _commit_on(config: PostgresConfig, conn: Any, txn: Transaction, gid: str,
               xid: int | None) -> None:
    row = prepared.prepared_xid(conn, txn, gid, config.target)
    commit_step("looked_up", txn)
    if row is not None:
        if xid is None or row == xid:
            try:
                execute(conn, "COMMIT PREPARED %s", (gid,))
                commit_step("committed", txn)
                return
            except Exception as exc:
                if pg_code(exc) == OBJECT_IN_USE:
                    # A twin commit (the driver and `recover --force`) is finishing
                    # this gid right now: wait until it is done, then ask the marker.
                    prepared.wait_until_resolved(conn, gid, config.lock_timeout_s)
                elif pg_code(exc) != UNDEFINED_OBJECT:
                    raise
                # gone between the look-up and the commit: decide by the marker
        else:
            # Not the transaction the decision names (xid differs): someone prepared
            # a transaction under this attempt's gid by hand. It must never commit.
            log_event("postgres.foreign_prepared", logging.WARNING, sink=txn.sink,
                      batch=txn.batch_id, txn=gid, expected_xid=xid, found_xid=row)
            prepared.rollback_prepared(conn, txn, gid, reason="not the decided attempt")
    _decide_by_marker(config, conn, txn, gid)


def _decide_by_marker(config: PostgresConfig, conn: Any, txn: Transaction, gid: str) -> None:
    committed = markers.committed_txn(conn, config.ident(config.marker_table), txn)
    if committed == gid:
        log_event("postgres.already_committed", sink=txn.sink, batch=txn.batch_id, txn=gid)
        return
    other = TransactionPool(txn.query_key, txn.sink).parse(committed) if committed else None
    if committed is not None and (other is None or other.run not in DIRECT_RUNS):
        # An at-least-once run may have committed this (batch, partition) before the
        # query moved to exactly-once; another exactly-once attempt never can.
        raise collision(config, txn, committed)
    raise DataLossError(
        f"prepared transaction {gid} of decided batch {txn.batch_id} (partition "
        f"{txn.partition}) no longer exists on {config.target}, and its marker row is not "
        f"in {config.marker_table}: its rows were never committed. Someone ran ROLLBACK "
        "PREPARED on it, or the database was restored or recreated after the prepare",
        sink=txn.sink, batch_id=txn.batch_id, txn_id=gid,
        fix=f"the rows of batch {txn.batch_id} partition {txn.partition} are missing from "
        f"{config.table}; re-process that batch from the source (e.g. restart the query "
        "from a copy of the checkpoint taken before it, into a clean table), then move "
        "this sink's commit log aside. The query refuses to continue until then",
    )


def _publish_on(config: PostgresConfig, conn: Any, txn: Transaction,
                columns: Sequence[str], written: Written | None) -> None:
    assert config.key
    marker = config.ident(config.marker_table)
    outcome = upsert.publish(conn, txn, marker, config.ident(config.table), columns,
                             config.key, config.order_by or (), config.lock_timeout_sql,
                             written)
    if outcome == "already":
        log_event("postgres.already_committed", sink=txn.sink, batch=txn.batch_id,
                  txn=txn.txn_id)
    elif outcome.startswith("other:"):
        raise collision(config, txn, outcome.split(":", 1)[1])
    elif outcome == "missing":
        raise DataLossError(
            f"the stage table of {txn.txn_id} (decided batch {txn.batch_id}, partition "
            f"{txn.partition}) no longer exists on {config.target}, and its marker row is "
            f"not in {config.marker_table}: its upserts were never applied. Someone "
            f"dropped {upsert.stage_name(txn.txn_id)}, or the database was restored",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix=f"the upserts of batch {txn.batch_id} partition {txn.partition} are "
            f"missing from {config.table}; re-process that batch from the source, then "
            "move this sink's commit log aside. The query refuses to continue until then",
        )


def collision(config: PostgresConfig, txn: Transaction,
              committed: str) -> TransactionIdCollisionError:
    return TransactionIdCollisionError(
        f"batch {txn.batch_id} partition {txn.partition} was committed by "
        f"{committed}, not by {txn.txn_id}, the attempt the batch decided: two writers "
        f"share this sink's query key and name in {config.marker_table}",
        sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
        fix="give each query its own checkpointLocation and each sink of a query "
        "its own name; check the table for rows this batch wrote twice",
    )
