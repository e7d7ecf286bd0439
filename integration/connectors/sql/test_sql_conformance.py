"""The staging-table SqlTableSink runs the conformance suite on SQLite: real Spark,
a real database file shared by the driver and the executors."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from sparkeos.connectors.sql import SqlTableSink
from sparkeos.connectors.sql.tables import TXN_COLUMN, Tables, engine_for
from sparkeos.core.snapshot.txpool import Transaction
from sparkeos.core.steps import commit_step
from sparkeos.testing.conformance import (
    ConnectorConformance,
    InProcessConformance,
    SampledDriverKills,
    SampledFormatConformance,
)


class TestSqlTableSinkOnSqlite(SampledDriverKills, ConnectorConformance):
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

    soak_batches_default = 200

    def soak_settings(self) -> dict[str, Any]:
        return {"claim_retention": 10}

    def bookkeeping(self, workdir: str) -> dict[str, int]:
        rows = self._query(workdir, "SELECT count(*) FROM orders__sparkeos_txn")
        return {"claim_rows": int(rows[0][0]) if rows else 0}

    def bookkeeping_bounds(self) -> dict[str, int]:
        return {"claim_rows": 2 * (10 + 10 + 5)}  # 2 partitions x (retention + purge period)

    def leftovers(self, workdir: str) -> list[str] | None:
        staged = self._query(workdir, "SELECT DISTINCT _sparkeos_txn FROM "
                                      "orders__sparkeos_stage")
        claims = self._query(workdir, "SELECT txn_id FROM orders__sparkeos_txn "
                                      "WHERE NOT committed")
        return sorted({f"staged {r[0]}" for r in staged} | {f"claimed {r[0]}" for r in claims})


class TestSqlFormat(SampledFormatConformance, TestSqlTableSinkOnSqlite):
    """The sink through ``writeStream.format("sparkeos-sql")`` on SQLite, end to end.
    Its commit runs where the file and PostgreSQL sinks' do (the process Spark commits
    in), and their formats' suites kill the driver there."""

    test_driver_crash_then_restart = None

    def format_spec(self, workdir: str) -> dict[str, Any]:
        return {"format": "sparkeos-sql",
                "options": {"url": f"sqlite:///{self.database(workdir)}", "dbtable": "orders",
                            "sparkeos.createTable": "true"}}


class TestSqlTableSinkOnPostgres(InProcessConformance, ConnectorConformance):
    """The same sink on PostgreSQL (READ COMMITTED), where two commits of one
    transaction really run at once: the in-process cases, the commit races among them.
    The Spark jobs run on SQLite above; nothing in them depends on the dialect."""

    @pytest.fixture(autouse=True)
    def _server(self, pg_server: Any, names: Any) -> Iterator[None]:
        import psycopg2

        self.dsn = pg_server.dsn
        self.names = names
        yield
        conn = psycopg2.connect(self.dsn)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{names.table}__sparkeos_txn", '
                        f'"{names.table}__sparkeos_stage"')
        conn.close()

    def url(self) -> str:
        import psycopg2.extensions

        parts = psycopg2.extensions.parse_dsn(self.dsn)
        return (f"postgresql+psycopg2://{parts.get('user', '')}:{parts.get('password', '')}@"
                f"{parts.get('host', '127.0.0.1')}:{parts.get('port', '5432')}/"
                f"{parts.get('dbname', '')}")

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        return {"factory": "sparkeos.connectors.sql:SqlTableSink",
                "kwargs": {"url": self.url(), "table": self.names.table,
                           "create_table": True}}

    def _query(self, sql: str) -> list[Any]:
        import psycopg2

        with psycopg2.connect(self.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (f'"{self.names.table}__sparkeos_txn"',))
            if cur.fetchone()[0] is None:
                return []
            cur.execute(sql)
            return list(cur.fetchall())

    def visible_ids(self, workdir: str) -> list[int]:
        return [row[0] for row in self._query(f'SELECT id FROM "{self.names.table}"')]

    soak_batches_default = 100

    def soak_settings(self) -> dict[str, Any]:
        return {"claim_retention": 10}

    def bookkeeping(self, workdir: str) -> dict[str, int]:
        rows = self._query(f'SELECT count(*) FROM "{self.names.table}__sparkeos_txn"')
        return {"claim_rows": int(rows[0][0]) if rows else 0}

    def bookkeeping_bounds(self) -> dict[str, int]:
        return {"claim_rows": 2 * (10 + 10 + 5)}

    def leftovers(self, workdir: str) -> list[str] | None:
        table = self.names.table
        staged = self._query(f'SELECT DISTINCT _sparkeos_txn FROM "{table}__sparkeos_stage"')
        claims = self._query(f'SELECT txn_id FROM "{table}__sparkeos_txn" WHERE NOT committed')
        return sorted({f"staged {r[0]}" for r in staged} | {f"claimed {r[0]}" for r in claims})


class _TablesClaimingByRead(Tables):
    """``Tables.publish`` as it was before the fix: the claim row read without a lock,
    then the stage copied. Two commits of one transaction both read "not committed"."""

    def publish(self, txn: Transaction, columns: list[str],
                key: Sequence[str] = ()) -> int | None:
        sa = self.sa
        target = self._target()
        stage = self._stage(target)
        with self.engine.begin() as conn:
            held = conn.execute(sa.select(self.txns.c.committed).where(
                self.txns.c.txn_id == txn.txn_id)).first()
            if held is None or held.committed:
                return None if held is None else 0
            commit_step("claimed", txn)
            mine = stage.c[TXN_COLUMN] == txn.txn_id
            moved = conn.execute(target.insert().from_select(
                columns, sa.select(*[stage.c[c] for c in columns]).where(mine))).rowcount
            conn.execute(stage.delete().where(mine))
            conn.execute(self.txns.update().where(self.txns.c.txn_id == txn.txn_id)
                         .values(committed=True))
            commit_step("moved", txn)
        return int(moved)


class SqlTableSinkClaimingByRead(SqlTableSink):
    @property
    def _tables(self) -> Tables:
        return _TablesClaimingByRead(engine_for(self.url), self.table)


class TestTheRaceCasesCatchAClaimByRead(TestSqlTableSinkOnPostgres):
    """The suite's own proof: with ``SqlTableSink``'s old claim put back, the
    concurrent-commit case must fail (it wrote every row twice on PostgreSQL)."""

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        spec = super().sink_spec(workdir)
        return {**spec, "factory": f"{__name__}:SqlTableSinkClaimingByRead"}

    @pytest.mark.xfail(strict=True, reason="the old claim duplicates under a twin commit")
    def test_two_commits_of_one_transaction_at_every_pair_of_steps(self, workdir: str
                                                                   ) -> None:
        super().test_two_commits_of_one_transaction_at_every_pair_of_steps(workdir)


_KEPT = "test_two_commits_of_one_transaction_at_every_pair_of_steps"
for _name in dir(TestTheRaceCasesCatchAClaimByRead):
    if _name.startswith("test_") and _name != _KEPT:
        setattr(TestTheRaceCasesCatchAClaimByRead, _name, None)
