"""A real PostgreSQL for the JDBC sink's tests, chosen in this order:

1. ``$SPARKEOS_POSTGRES_DSN``: a server you run (needs max_prepared_transactions > 0);
2. testcontainers' PostgreSQL, when a Docker engine answers;
3. ``docker/services/postgres.sh start``: a private local server (installed from
   Debian's packages if missing), started once per session and stopped at the end if
   this session started it.

Every path is a real server. Tests that stop or restart the server need path 3.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from integration.connectors.jdbc.support import (
    DSN_ENV,
    Names,
    PgServer,
    docker_answers,
    run_script,
    script_dsn,
)
from sparkeos.connectors.jdbc.dsn import to_libpq


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    dsn = os.environ.get(DSN_ENV)
    if dsn:
        yield PgServer(to_libpq(dsn), "env")
        return
    if docker_answers():
        try:
            from testcontainers.postgres import PostgresContainer
        except ImportError:
            pass
        else:
            container = PostgresContainer("postgres:16-alpine", driver=None).with_command(
                "postgres -c max_prepared_transactions=64")
            container.start()
            try:
                yield PgServer(to_libpq(container.get_connection_url()), "testcontainers")
            finally:
                container.stop()
            return
    was_running = run_script("status")[0] == 0
    server = PgServer(script_dsn(run_script("start")[1]), "script")
    try:
        yield server
    finally:
        if not was_running:
            run_script("stop")


@pytest.fixture
def admin(pg_server: PgServer) -> Iterator[Any]:
    """An autocommit psycopg2 connection for setting up and checking."""
    import psycopg2

    conn = psycopg2.connect(pg_server.dsn)
    conn.autocommit = True
    yield conn
    conn.close()


@pytest.fixture
def names(pg_server: PgServer) -> Iterator[Names]:
    import psycopg2

    tag = uuid.uuid4().hex[:10]
    n = Names(table=f"t_{tag}", marker=f"m_{tag}", query_key=f"q{tag}")
    yield n
    try:
        conn = psycopg2.connect(pg_server.dsn)
    except psycopg2.OperationalError:
        pg_server.start()  # a failed test may have left the server stopped
        conn = psycopg2.connect(pg_server.dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        # Test cleanup only: the sink itself never looks gids up by prefix.
        cur.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
                    (n.gid_prefix() + "%",))
        for (gid,) in cur.fetchall():
            cur.execute("ROLLBACK PREPARED %s", (gid,))
        # Sessions a failed test left open on this test's tables (and only those).
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE pid <> "
                    "pg_backend_pid() AND relation IN (to_regclass(%s), to_regclass(%s))",
                    (f'"{n.table}"', f'"{n.marker}"'))
        cur.execute("SET lock_timeout = '20s'")
        cur.execute(f'DROP TABLE IF EXISTS "{n.table}", "{n.marker}"')
    conn.close()
