"""The staging-table SqlTableSink runs the conformance suite on SQLite: real Spark,
a real database file shared by the driver and the executors."""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from sparkeos.testing.conformance import ConnectorConformance


class TestSqlTableSinkOnSqlite(ConnectorConformance):
    def database(self, workdir: str) -> str:
        return os.path.join(workdir, "shop.db")

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        return {"factory": "sparkeos.connectors.sql:SqlTableSink",
                "kwargs": {"url": f"sqlite:///{self.database(workdir)}", "table": "orders",
                           "create_table": True}}

    def plain_spec(self, workdir: str) -> dict[str, Any] | None:
        return {"factory": "integration.connectors.sql.plain:plain_sql_writer",
                "kwargs": {"url": f"sqlite:///{self.database(workdir)}", "table": "orders"}}

    def _query(self, workdir: str, sql: str) -> list[Any]:
        if not os.path.exists(self.database(workdir)):
            return []
        with sqlite3.connect(self.database(workdir), timeout=60) as conn:
            try:
                return conn.execute(sql).fetchall()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return []
                raise

    def visible_ids(self, workdir: str) -> list[int]:
        return [row[0] for row in self._query(workdir, "SELECT id FROM orders")]

    def leftovers(self, workdir: str) -> list[str] | None:
        staged = self._query(workdir, "SELECT DISTINCT _sparkeos_txn FROM "
                                      "orders__sparkeos_stage")
        claims = self._query(workdir, "SELECT txn_id FROM orders__sparkeos_txn "
                                      "WHERE NOT committed")
        return sorted({f"staged {r[0]}" for r in staged} | {f"claimed {r[0]}" for r in claims})
