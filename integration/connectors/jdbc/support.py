"""Helpers of the PostgreSQL sink's integration tests (fixtures are in conftest.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkeos.connectors.jdbc import PostgresSink
from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.faults import FaultPlan
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.testing.inprocess import ArrowRunner, MemoryStore

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "docker" / "services" / "postgres.sh"
DSN_ENV = "SPARKEOS_POSTGRES_DSN"


def run_script(command: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = subprocess.run(
        ["bash", str(SCRIPT), command], env={**os.environ, **(env or {})},
        capture_output=True, text=True, timeout=600,
    )
    if result.returncode not in (0, 3) or (command != "status" and result.returncode):
        raise RuntimeError(f"{SCRIPT.name} {command} failed ({result.returncode}):\n"
                           f"{result.stdout}\n{result.stderr}")
    return result.returncode, result.stdout


def script_dsn(output: str) -> str:
    return next(line.split("=", 1)[1] for line in output.splitlines()
                if line.startswith("dsn="))


@dataclass
class PgServer:
    """The session's server: ``kind`` is the path it came from (``env``, ``containers``
    or ``local``); a container or a local server can be stopped and started again
    (same address, data and prepared transactions kept), a server you run cannot."""

    dsn: str
    kind: str
    env: dict[str, str] = field(default_factory=dict)
    container: Any = None  # integration.fixtures.services.Container on the containers path

    def stop(self) -> None:
        self._control("stop")

    def start(self) -> None:
        self._control("start")

    def _control(self, action: str) -> None:
        if self.container is not None:
            getattr(self.container, action)()
        elif self.kind == "local":
            run_script(action, self.env)
        else:
            pytest.skip(f"{action}s the server: needs a container or the local script "
                        f"(this server comes from {self.kind})")

    def restart(self) -> None:
        """Fast shutdown, then start again (prepared transactions survive)."""
        self.stop()
        self.start()


@dataclass
class Names:
    """Per-test table, marker table and query key; dropped / rolled back afterwards."""

    table: str
    marker: str
    query_key: str

    def gid_prefix(self) -> str:
        return f"seos-{self.query_key}-"


def sink_for(pg_server: PgServer, names: Names, **overrides: Any) -> PostgresSink:
    args: dict[str, Any] = {"dsn": pg_server.dsn, "table": names.table,
                            "marker_table": names.marker, "create_table": True}
    args.update(overrides)
    return PostgresSink(**args)


def coordinator(sink: PostgresSink, log: CommitLog | None, names: Names,
                faults: FaultPlan | None = None,
                guarantee: Guarantee = Guarantee.EXACTLY_ONCE, name: str = "pg") -> Coordinator:
    return Coordinator(sink, CoordinatorConfig(name=name, guarantee=guarantee), log,
                       names.query_key, faults)


def memory_log() -> CommitLog:
    return CommitLog(MemoryStore())


def id_batch(ids: Sequence[int], **extra: Sequence[Any]) -> pa.RecordBatch:
    columns: dict[str, Any] = {"id": pa.array(list(ids), pa.int64())}
    for name, values in extra.items():
        columns[name] = pa.array(list(values))
    return pa.RecordBatch.from_pydict(columns)


def ids_runner(partitions: Sequence[Sequence[int]], **kwargs: Any) -> ArrowRunner:
    return ArrowRunner([id_batch(p) for p in partitions], **kwargs)


def table_ids(admin: Any, table: str) -> list[int]:
    with admin.cursor() as cur:
        cur.execute(f'SELECT id FROM "{table}" ORDER BY id')
        return [r[0] for r in cur.fetchall()]


def prepared_gids(admin: Any, names: Names) -> list[str]:
    """Test check only: the sink itself never looks gids up by prefix."""
    with admin.cursor() as cur:
        cur.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s ORDER BY gid",
                    (names.gid_prefix() + "%",))
        return [r[0] for r in cur.fetchall()]


def marker_rows(admin: Any, names: Names) -> list[tuple[int, int]]:
    with admin.cursor() as cur:
        cur.execute(f'SELECT batch_id, "partition" FROM "{names.marker}" ORDER BY 1, 2')
        return [(r[0], r[1]) for r in cur.fetchall()]


def prepared_on_tables(dsn: str, *tables: str) -> list[str]:
    """Prepared transactions holding locks on ``tables`` (whatever their gids), and open
    sessions writing them: what a test's attempts left behind."""
    import psycopg2

    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        regs = [f'"{t}"' for t in tables]
        cur.execute(
            "SELECT DISTINCT p.gid FROM pg_prepared_xacts p"
            " JOIN pg_locks x ON x.locktype = 'transactionid'"
            "  AND x.transactionid = p.transaction"
            " JOIN pg_locks r ON r.virtualtransaction = x.virtualtransaction"
            "  AND r.relation = ANY(ARRAY(SELECT to_regclass(t) FROM unnest(%s::text[]) t))",
            (regs,))
        found = sorted(f"prepared {r[0]}" for r in cur.fetchall())
        cur.execute(
            "SELECT DISTINCT a.application_name FROM pg_locks l JOIN pg_stat_activity a"
            " ON a.pid = l.pid WHERE a.pid <> pg_backend_pid() AND l.relation ="
            " ANY(ARRAY(SELECT to_regclass(t) FROM unnest(%s::text[]) t))", (regs,))
        found += sorted(f"open session {r[0]}" for r in cur.fetchall())
    conn.close()
    return found
