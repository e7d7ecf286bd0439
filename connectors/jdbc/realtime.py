"""PostgresSink in Spark's real-time mode: one transaction per (partition, epoch).

``peek_mark`` reads the partition's mark on a pooled connection (no lock, no fence,
no DDL). ``open_epoch`` opens the attempt's session (named after it, as in phase 1),
ends every other session of the same participant (``pg_terminate_backend``: an older
attempt of the partition, a zombie from before a restart; its open transaction is
rolled back), takes the participant's advisory transaction lock (so two attempts never
interleave),
and reads the partition's mark from the marks table. ``write_epoch`` COPYs rows as they
arrive; ``commit_epoch`` writes the mark row and COMMITs: rows and mark together. No
transaction is prepared, so ``max_prepared_transactions`` may be 0.

The marks table (``<marker_table>_epochs``, made on first use) holds one row per
(query, sink, partition): the mark of ``core.snapshot.positions`` as JSON, and the
table it is of (``destination``: the lost-checkpoint check looks for other queries'
marks of the same sink name and table). Appends only:
``mode="upsert"`` is refused in real-time mode.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.protocol import EpochParticipant, JsonDict, Transaction

from . import prepared, writing
from .config import PostgresConfig
from .connections import POOL
from .database import translated
from .writing import PgTransaction

MARKS_SUFFIX = "_epochs"
_READY: set[tuple[str, str]] = set()
"""(server, marks table) this process has seen to exist: asked once per process, not
per (partition, epoch)."""
MARKS_COMMENT = ("sparkeos: the last committed mark of each (query, sink, partition) of "
                 "a PostgresSink in Spark's real-time mode; do not edit")


@dataclass
class PgEpoch:
    txn: Transaction
    session: PgTransaction
    mark: JsonDict | None


class PostgresEpochs(EpochParticipant[PgEpoch]):
    """The epoch participant of a ``PostgresSink`` (``PostgresSink.epoch_participant``)."""

    def __init__(self, sink: PostgresConfig,
                 batch_output: Callable[[str, str], str | None] | None = None) -> None:
        """``batch_output``: the sink's own lost-checkpoint check of its micro-batch
        markers, asked too: another query may have written the name in micro-batches."""
        self.batch_output = batch_output
        if sink.mode != "transactional":
            raise ConfigurationError(
                f"PostgresSink(mode={sink.mode!r}) cannot write in real-time mode",
                fix="use mode='transactional' (appends) with exactly_once_writer, or a "
                "micro-batch trigger for upserts")
        # A plain transaction committed in the task: never a prepared one.
        self.config: PostgresConfig = dataclasses.replace(sink, commit_in_task=True)

    def marks_table(self) -> Any:
        from psycopg2 import sql

        *schema, name = self.config.ident(self.config.marker_table).strings
        return sql.Identifier(*schema, f"{name[:48]}{MARKS_SUFFIX}")

    def destination(self) -> str:
        """The table the marks are of (one marks table serves every table whose sinks
        share the marker table)."""
        return ".".join(self.config.ident(self.config.table).strings)

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        from psycopg2 import sql

        def read(conn: Any) -> list[tuple[str, int]]:
            with conn.cursor() as cur:
                cur.execute(sql.SQL(
                    "SELECT query_key, max(epoch) FROM {m} WHERE sink = %s"
                    " AND query_key <> %s AND destination IN (%s, '')"
                    " GROUP BY query_key ORDER BY query_key LIMIT 5").format(
                        m=self.marks_table()), (sink, query_key, self.destination()))
                return list(cur.fetchall())

        with translated(self.config, "looking for this sink's output from other queries"):
            others = POOL.run(self.config.dsn, self.config.connect_timeout_s, read)
        found = [f"marks in {'.'.join(self.marks_table().strings)} of query keys "
                 + ", ".join(f"{key} (epochs up to {epoch})" for key, epoch in others)
                 ] if others else []
        batches = self.batch_output(query_key, sink) if self.batch_output else None
        return "; ".join([*found, *([batches] if batches else [])]) or None

    def peek_mark(self, txn: Transaction) -> JsonDict | None:
        marks = self.marks_table()

        def read(conn: Any) -> JsonDict | None:
            with conn.cursor() as cur:  # no DDL, no lock: no table yet is no mark
                cur.execute("SELECT to_regclass(%s)::oid", (marks.as_string(conn),))
                if cur.fetchone()[0] is None:
                    return None
                return self._read_mark(cur, txn)

        with translated(self.config, f"reading the mark of partition {txn.partition}", txn):
            return POOL.run(self.config.dsn, self.config.connect_timeout_s, read)

    def open_epoch(self, txn: Transaction) -> PgEpoch:
        config = self.config
        self._ensure_ready(txn)
        session = writing.open_session(config, txn)
        try:
            with translated(config, f"opening epoch {txn.batch_id} of partition "
                            f"{txn.partition}", txn), session.conn.cursor() as cur:
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
                    (_like_prefix(prepared.participant_session_prefix(txn)),))
                cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                            (prepared.participant_session_prefix(txn),))
                mark = self._read_mark(cur, txn)
        except BaseException:
            writing.abort(config, session)
            raise
        return PgEpoch(txn, session, mark)

    def epoch_mark(self, handle: PgEpoch) -> JsonDict | None:
        return handle.mark

    def write_epoch(self, handle: PgEpoch, rows: pa.RecordBatch) -> None:
        writing.copy_rows(self.config, handle.session, rows)

    def commit_epoch(self, handle: PgEpoch, mark: JsonDict) -> None:
        from psycopg2 import sql

        config, session, txn = self.config, handle.session, handle.txn
        try:
            with translated(config, f"committing epoch {txn.batch_id} of partition "
                            f"{txn.partition}", txn), session.conn.cursor() as cur:
                cur.execute(sql.SQL(
                    "INSERT INTO {m} (query_key, sink, \"partition\", epoch, mark, txn_id,"
                    " destination) VALUES (%s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (query_key, sink, \"partition\") DO UPDATE SET"
                    " epoch = EXCLUDED.epoch, mark = EXCLUDED.mark,"
                    " txn_id = EXCLUDED.txn_id, destination = EXCLUDED.destination,"
                    " committed_at = now()"
                ).format(m=self.marks_table()), (txn.query_key, txn.sink, txn.partition,
                                                 txn.batch_id, json.dumps(mark), txn.txn_id,
                                                 self.destination()))
                cur.execute("COMMIT")
                cur.execute("RESET application_name")
        except BaseException:
            writing.abort(config, session)
            raise
        POOL.release(config.dsn, session.conn)
        session.conn = None

    def abort_epoch(self, handle: PgEpoch) -> None:
        writing.abort(self.config, handle.session)

    def _read_mark(self, cur: Any, txn: Transaction) -> JsonDict | None:
        from psycopg2 import sql

        cur.execute(sql.SQL("SELECT mark FROM {m} WHERE query_key = %s AND sink = %s"
                            " AND \"partition\" = %s").format(m=self.marks_table()),
                    (txn.query_key, txn.sink, txn.partition))
        row = cur.fetchone()
        if row is None:
            return None
        value = json.loads(row[0]) if isinstance(row[0], str) else row[0]
        return value if isinstance(value, dict) else {"unreadable": value}

    def _ensure_ready(self, txn: Transaction) -> None:
        ready = (self.config.target, ".".join(self.marks_table().strings))
        if ready not in _READY:
            self._ensure_marks_table(txn)
            _READY.add(ready)

    def _ensure_marks_table(self, txn: Transaction) -> None:
        from psycopg2 import errors, sql

        marks = self.marks_table()

        def create(conn: Any) -> None:
            with conn.cursor() as cur:
                cur.execute("SELECT to_regclass(%s)::oid", (marks.as_string(conn),))
                table = cur.fetchone()[0]
                if table is not None:
                    cur.execute("SELECT 1 FROM pg_attribute WHERE attrelid = %s AND"
                                " attname = 'destination' AND NOT attisdropped", (table,))
                    if cur.fetchone() is None:
                        # A table made before marks named their destination: '' there
                        # (unknown, which the lost-checkpoint check counts as this one).
                        # The ALTER's exclusive lock waits for open epochs: bounded.
                        cur.execute("BEGIN")
                        cur.execute("SET LOCAL lock_timeout = '10s'")
                        cur.execute(sql.SQL("ALTER TABLE {m} ADD COLUMN IF NOT EXISTS"
                                            " destination text NOT NULL DEFAULT ''").format(
                                                m=marks))
                        cur.execute("COMMIT")
                    return
                cur.execute("BEGIN")
                cur.execute(sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {m} ("
                    " query_key text NOT NULL, sink text NOT NULL,"
                    " \"partition\" integer NOT NULL, epoch bigint NOT NULL,"
                    " mark text NOT NULL, txn_id text NOT NULL,"
                    " destination text NOT NULL DEFAULT '',"
                    " committed_at timestamptz NOT NULL DEFAULT now(),"
                    " PRIMARY KEY (query_key, sink, \"partition\"))").format(m=marks))
                cur.execute(sql.SQL("COMMENT ON TABLE {m} IS %s").format(m=marks),
                            (MARKS_COMMENT,))
                cur.execute("COMMIT")

        with translated(self.config, "creating the real-time marks table", txn):
            try:
                POOL.run(self.config.dsn, self.config.connect_timeout_s, create)
            except errors.UniqueViolation:  # another partition created it meanwhile
                pass


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


__all__ = ["MARKS_SUFFIX", "PgEpoch", "PostgresEpochs"]
