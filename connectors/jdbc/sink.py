"""Exactly-once PostgreSQL sink: two-phase commit with the pool's IDs as gids.

Phase 1, in each Spark task attempt (``mode="transactional"``, the default); every
attempt has its own gid, the attempt's transaction ID::

    begin    session named after the attempt; BEGIN
    write    COPY ... FROM STDIN (CSV made by pyarrow), never row by row; the rows are
             fingerprinted as they go (``core.snapshot.fingerprint``)
    prepare  if a marker shows the same rows committed for this (batch, partition)
             (a replay partitioned as before, a late zombie), ROLLBACK: nothing written
             (``core.snapshot.replay``); else insert the attempt's marker row (query, sink,
             batch, partition, gid, rows, fingerprint) and PREPARE TRANSACTION
             '<gid>'; the receipt carries rows and the xid

Under ``at_least_once`` (and ``none``) each task COMMITs its rows with its marker row at
once instead of preparing them (``commit_in_task``): a task killed mid-write leaves
nothing behind (PostgreSQL rolls back the transaction of a closed session), so no
prepared transaction of a dead attempt piles up towards ``max_prepared_transactions`` or
holds row locks its retry would wait on, and ``max_prepared_transactions`` may be 0.

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

Where each mechanism lives (this class only says which step calls which): ``config.py``
the validated configuration and the DSN; ``preflight.py`` the checks before a batch;
``writing.py`` phase 1 in the task (session, COPY, prepare); ``commit.py`` phase 2;
``recovery.py`` rollback, sweep and probe; ``markers.py``, ``prepared.py`` and
``upsert.py`` the marker rows, prepared transactions and stage tables; ``arrowpg.py``
Arrow to PostgreSQL types and CSV; ``database.py`` and ``errors.py`` the pooled calls
and error translation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkeos.core.config import Guarantee
from sparkeos.core.protocol import (
    EpochParticipant,
    Receipt,
    Transaction,
    TransactionalSink,
    TxnState,
)
from sparkeos.core.snapshot.txpool import AttemptRange

from . import commit, database, markers, preflight, recovery, writing
from . import dsn as dsn_mod
from .config import DSN_ENV, MODES, PostgresConfig, description_args
from .connections import POOL
from .writing import MAX_GID_LENGTH, STAGE_TABLE, PgTransaction

__all__ = ["DSN_ENV", "MAX_GID_LENGTH", "MODES", "STAGE_TABLE", "PgTransaction",
           "PostgresSink"]


@dataclass(frozen=True)
class PostgresSink(PostgresConfig, TransactionalSink[PgTransaction]):
    """Write each batch into a PostgreSQL table, exactly once (or idempotently).

    The arguments are described in :class:`~.config.PostgresConfig`; each method below
    is one step of the protocol and hands its mechanism to the module named after it.
    """

    secret_fields = frozenset({"dsn"})

    # Here, not on PostgresConfig: @dataclass(frozen=True) would otherwise generate a
    # hash over every field, and ``columns`` is a dict.
    def __hash__(self) -> int:
        return hash((self.dsn, self.table, self.mode, self.marker_table, self.commit_in_task))

    # -- what the coordinator reads -------------------------------------------------------
    @property  # a property: the guarantee depends on the mode
    def guarantees(self) -> frozenset[Guarantee]:  # type: ignore[override]
        if self.commit_in_task is True:
            return frozenset({Guarantee.AT_LEAST_ONCE, Guarantee.NONE})
        return frozenset(Guarantee)

    @property  # a property: the commit differs by mode
    def commit_steps(self) -> tuple[str, ...]:  # type: ignore[override]
        if self.staged_upserts:
            return ("claimed", "applied")
        return () if self.commit_in_task is True else ("looked_up", "committed")

    def for_guarantee(self, guarantee: Guarantee) -> PostgresSink:
        if self.commit_in_task is None:
            return dataclasses.replace(
                self, commit_in_task=guarantee is not Guarantee.EXACTLY_ONCE)
        return self

    def cluster_by(self) -> tuple[str, ...]:
        if self.mode != "upsert" or not self.key:
            return ()
        to_frame = {table: frame for frame, table in (self.columns or {}).items()}
        return tuple(to_frame.get(k, k) for k in self.key)

    def identity(self) -> dict[str, Any]:
        return {"target": self.target, "table": self.table, "mode": self.mode}

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["target"] = dsn_mod.redact(self.dsn)  # no password
        return out

    @classmethod
    def from_description(cls, description: Mapping[str, Any]) -> PostgresSink:
        """Rebuild from ``describe()``: the DSN is not stored; it comes from
        ``$SPARKEOS_POSTGRES_DSN``, else the stored target without password (libpq then
        uses PGPASSWORD / ~/.pgpass)."""
        return cls(**description_args(description))

    # -- driver, before each batch -----------------------------------------------------------
    def validate(self, schema: pa.Schema) -> None:
        preflight.validate(self, schema)

    def check_participants(self, count: int) -> None:
        preflight.check_participants(self, count)

    # -- phase 1, in a task -------------------------------------------------------------------
    def begin(self, txn: Transaction) -> PgTransaction:
        return writing.open_session(self, txn)

    def write(self, handle: PgTransaction, batch: pa.RecordBatch) -> None:
        writing.copy_rows(self, handle, batch)

    def prepare(self, handle: PgTransaction) -> Receipt:
        return writing.finish(self, handle)

    def abort(self, handle: PgTransaction, txn: Transaction) -> None:
        """This attempt's own session only: an open transaction is rolled back; one this
        attempt already prepared is rolled back by its gid (never another attempt's)."""
        if not writing.abort(self, handle) and not self.plain_upserts and not handle.skipped:
            self.rollback(txn)

    # -- phase 2 and recovery -----------------------------------------------------------------
    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        if self.plain_upserts:
            return  # committed by the task itself, without marker rows
        if receipt.get("committed") or receipt.get("skipped"):
            # Committed by the task itself (at-least-once appends), or the attempt found
            # its (batch, partition) committed by another (a replay under
            # at_least_once) and wrote nothing: there is nothing to commit.
            pass
        elif not self.staged_upserts:
            commit.commit_prepared(self, txn, receipt)
        elif receipt.get("staged"):
            commit.apply_stage(self, txn, receipt)
        commit.purge_markers(self, txn)

    def rollback(self, txn: Transaction) -> None:
        if self.plain_upserts:
            return  # tasks commit their own plain transactions; nothing is ever staged
        database.run(self, f"rolling back transaction {txn.txn_id}",
                     lambda conn: recovery.rollback_on(self, conn, txn), txn, phase="rollback")

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        """One query for this sink's sessions, one for its prepared transactions (or
        stage tables)."""
        if self.plain_upserts or not ranges:
            return
        database.run(self, f"rolling back attempts of batches "
                     f"{sorted({r.batch_id for r in ranges})}",
                     lambda conn: recovery.sweep_on(self, conn, ranges, keep), phase="rollback")

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        if self.mode == "upsert":
            return None  # upserts rewrite the same rows: a replay is harmless
        marker, table = self.ident(self.marker_table), self.ident(self.table)
        return database.run(self, "looking for this sink's output from other queries",
                            lambda conn: markers.other_queries(conn, marker, query_key, sink,
                                                               table), phase="setup")

    def probe(self, txn: Transaction) -> TxnState:
        if self.plain_upserts:
            return TxnState.UNKNOWN
        return database.run(self, f"probing transaction {txn.txn_id}",
                            lambda conn: recovery.probe_on(self, conn, txn), txn, phase="probe")

    def close(self) -> None:
        POOL.close_dsn(self.dsn)

    def epoch_participant(self) -> EpochParticipant[Any]:
        """Real-time mode: a transaction per (partition, epoch) (``realtime``)."""
        from .realtime import PostgresEpochs

        return PostgresEpochs(self, batch_output=self.output_of_other_queries)
