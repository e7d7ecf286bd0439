"""PostgresSink in real-time mode (``exactly_once_writer``): its epoch participant in
process against the server, with the replays and zombies a crash leaves."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from integration.connectors.jdbc.support import Names, sink_for, table_ids
from integration.fixtures.postgres import PgServer
from sparkeos.connectors.jdbc import PostgresSink
from sparkeos.connectors.jdbc.realtime import MARKS_SUFFIX
from sparkeos.core.errors import ConfigurationError
from sparkeos.core.streaming.realtime import exactly_once_writer
from sparkeos.testing.conformance.realtime import EpochConformance


class TestPostgresEpochs(EpochConformance):
    @pytest.fixture(autouse=True)
    def table(self, pg_server: PgServer, names: Names, admin: Any) -> Iterator[None]:
        self.pg, self.names, self.admin = pg_server, names, admin
        with admin.cursor() as cur:
            cur.execute(f'CREATE TABLE "{names.table}" (id bigint, key bytea, value bytea)')
        yield
        with admin.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{names.marker}{MARKS_SUFFIX}"')

    def make_sink(self, workdir: str) -> PostgresSink:
        return sink_for(self.pg, self.names, create_table=False)

    def visible_ids(self, workdir: str) -> list[int]:
        return table_ids(self.admin, self.names.table)


def test_upserts_are_refused_in_real_time_mode(pg_server: PgServer, names: Names) -> None:
    sink = sink_for(pg_server, names, mode="upsert", key=["id"])
    with pytest.raises(ConfigurationError, match="cannot write in real-time mode"):
        exactly_once_writer(sink, "rt")
