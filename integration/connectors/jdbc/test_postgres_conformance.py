"""The PostgreSQL sink runs the conformance suite: real Spark, real PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from integration.connectors.jdbc.support import PgServer
from sparkeos.testing.conformance import ConnectorConformance


class TestPostgresSinkConformance(ConnectorConformance):
    @pytest.fixture(autouse=True)
    def _server(self, pg_server: PgServer, names: Any) -> None:
        self.dsn = pg_server.dsn
        self.names = names

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        return {"factory": "sparkeos.connectors.jdbc:PostgresSink",
                "kwargs": {"dsn": self.dsn, "table": self.names.table,
                           "marker_table": self.names.marker, "create_table": True}}

    def plain_spec(self, workdir: str) -> dict[str, Any] | None:
        return {"factory": "integration.connectors.jdbc.plain:plain_insert_writer",
                "kwargs": {"dsn": self.dsn, "table": self.names.table}}

    def visible_ids(self, workdir: str) -> list[int]:
        import psycopg2

        with psycopg2.connect(self.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (f'"{self.names.table}"',))
            if cur.fetchone()[0] is None:
                return []
            cur.execute(f'SELECT id FROM "{self.names.table}"')
            return [row[0] for row in cur.fetchall()]
