"""The PostgreSQL sink runs the conformance suite: real Spark, real PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from integration.connectors.jdbc.support import PgServer, prepared_on_tables
from sparkeos.connectors.jdbc import PostgresSink
from sparkeos.testing.conformance import (
    ClusterConformance,
    ConnectorConformance,
    FormatConformance,
    InProcessConformance,
    SampledDriverKills,
    SampledFormatConformance,
)
from sparkeos.testing.tcpproxy import LOST_REPLY, POSTGRES, RESET, WireFault
from sparkeos.testing.wirefaults import WireFaultConformance


class TestPostgresSinkConformance(SampledDriverKills, ClusterConformance, ConnectorConformance):
    # On the cluster, the driver killed with the tasks' transactions prepared on other
    # hosts. A lost executor's prepared transaction is a failed attempt's, met by its
    # retry as in test_task_retry_reuses_the_transaction_id; losing the executor itself
    # is the protocol's, proven by the file sink's cluster suite.
    test_executor_lost_in_phase_1_on_a_cluster = None

    @pytest.fixture(autouse=True)
    def _server(self, pg_server: PgServer, names: Any) -> None:
        self.dsn = pg_server.dsn
        self.names = names

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        # A short lock timeout: the concurrent-attempt cases make attempts wait for each
        # other on purpose; the jobs never contend.
        return {"factory": "sparkeos.connectors.jdbc:PostgresSink",
                "kwargs": {"dsn": self.dsn, "table": self.names.table,
                           "marker_table": self.names.marker, "create_table": True,
                           "lock_timeout_s": 3.0}}

    def plain_spec(self, workdir: str) -> dict[str, Any] | None:
        return {"factory": "integration.connectors.jdbc.plain:plain_insert_writer",
                "kwargs": {"dsn": self.dsn, "table": self.names.table}}

    def leftovers(self, workdir: str) -> list[str] | None:
        return prepared_on_tables(self.dsn, self.names.table, self.names.marker)

    soak_batches_default = 1000

    def soak_settings(self) -> dict[str, Any]:
        return {"marker_retention": 10}

    def bookkeeping(self, workdir: str) -> dict[str, int]:
        import psycopg2

        with psycopg2.connect(self.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (f'"{self.names.marker}"',))
            if cur.fetchone()[0] is None:
                return {"marker_rows": 0}
            cur.execute(f'SELECT count(*) FROM "{self.names.marker}"')
            return {"marker_rows": int(cur.fetchone()[0])}

    def bookkeeping_bounds(self) -> dict[str, int]:
        return {"marker_rows": 2 * (10 + 5)}  # 2 partitions x (retention + a few)

    def visible_ids(self, workdir: str) -> list[int]:
        import psycopg2

        with psycopg2.connect(self.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (f'"{self.names.table}"',))
            if cur.fetchone()[0] is None:
                return []
            cur.execute(f'SELECT id FROM "{self.names.table}"')
            return [row[0] for row in cur.fetchall()]


class TestPostgresWireFaults(WireFaultConformance, TestPostgresSinkConformance):
    """Issue 37: the sink's connections through a fault proxy, one step of its commit
    path hurt per case: the reply to ``COMMIT PREPARED`` lost after the server committed
    (the driver's connection dies; the marker row says the gid is committed), the
    connection reset before it (the gid is still prepared), the reply to ``PREPARE
    TRANSACTION`` lost (the attempt's gid is prepared behind its back: the task's abort
    rolls it back by gid, the retry prepares its own), the reply to the marker row's
    INSERT lost (the session dies: its transaction rolls back), and the replies of a
    seeded third of every PREPARE and COMMIT PREPARED lost."""

    wire_protocol = POSTGRES
    wire_steps = ("commit_prepared_reply_lost", "commit_prepared_reset",
                  "prepare_reply_lost", "marker_reply_lost", "a_third_of_replies_lost")

    def wire_upstream(self) -> str:
        import psycopg2.extensions

        params = psycopg2.extensions.parse_dsn(self.dsn)
        host = params.get("host", "")
        if not host or host.startswith("/") or "," in host:
            pytest.skip(f"the fault proxy forwards to one TCP address, not {host!r}")
        return f"{host}:{params.get('port', 5432)}"

    def wire_sink(self, workdir: str, address: str) -> PostgresSink:
        import psycopg2.extensions

        host, port = address.rsplit(":", 1)
        # A primary key, as most tables have: an attempt's rows left prepared then
        # block its retry's (a lock wait), which a table without one would hide.
        kwargs = {**self.sink_spec(workdir)["kwargs"], "key": ["id"],
                  "dsn": psycopg2.extensions.make_dsn(self.dsn, host=host, port=port)}
        return PostgresSink(**kwargs)

    def wire_faults(self, step: str) -> list[WireFault]:
        return {
            "commit_prepared_reply_lost": [WireFault(LOST_REPLY, r"^COMMIT PREPARED")],
            "commit_prepared_reset": [WireFault(RESET, r"^COMMIT PREPARED")],
            "prepare_reply_lost": [WireFault(LOST_REPLY, r"^PREPARE TRANSACTION")],
            "marker_reply_lost": [WireFault(LOST_REPLY,
                                            rf'^INSERT INTO "{self.names.marker}"')],
            # Seeded: the same statements every run, in phase 1 and phase 2 and in the
            # recovery after a restart.
            "a_third_of_replies_lost": [WireFault(
                LOST_REPLY, r"^(COMMIT PREPARED|PREPARE TRANSACTION)", fraction=1 / 3)],
        }[step]


class TestPostgresFormat(SampledFormatConformance, TestPostgresSinkConformance):
    """The sink through ``writeStream.format("sparkeos-postgres")`` with the options of
    Spark's JDBC source (``url``, ``dbtable``, ``user``, ``password``)."""

    def format_spec(self, workdir: str) -> dict[str, Any]:
        import psycopg2.extensions

        dsn = psycopg2.extensions.parse_dsn(self.dsn)
        url = f"jdbc:postgresql://{dsn['host']}:{dsn.get('port', 5432)}/{dsn['dbname']}"
        return {"format": "sparkeos-postgres",
                "options": {"url": url, "user": dsn["user"],
                            "password": dsn.get("password", ""),
                            "dbtable": self.names.table,
                            "sparkeos.markerTable": self.names.marker,
                            "sparkeos.createTable": "true",
                            "sparkeos.lockTimeoutSeconds": "3"}}


class TestPostgresUpsertConformance(InProcessConformance, TestPostgresSinkConformance):
    """``mode="upsert"`` commits differently (a stage table per attempt, applied with
    the marker row on the driver): the in-process cases, the commit races among them.
    The Spark jobs are those of the mode above."""

    # An upsert writes the same rows again on a re-run: a lost checkpoint duplicates
    # nothing, so the sink does not look for other queries' output.
    test_lost_checkpoint_is_refused_not_duplicated = None
    soak_batches_default = 300

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        spec = super().sink_spec(workdir)
        return {**spec, "kwargs": {**spec["kwargs"], "mode": "upsert", "key": ["id"]}}


class TestPostgresUpsertFormat(FormatConformance, TestPostgresUpsertConformance):
    """``sparkeos.mode=upsert`` through ``sparkeos-postgres``: the replay cases, in
    process through the format's own calls (its Spark jobs are the append mode's)."""

    def format_spec(self, workdir: str) -> dict[str, Any]:
        spec = TestPostgresFormat.format_spec(self, workdir)  # type: ignore[arg-type]
        return {**spec, "options": {**spec["options"], "sparkeos.mode": "upsert",
                                    "sparkeos.key": "id"}}
