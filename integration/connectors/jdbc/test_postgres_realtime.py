"""PostgresSink in real-time mode (``exactly_once_writer``): its epoch participant in
process against the server, with the replays and zombies a crash leaves; and Kafka ->
Spark's real-time mode -> PostgreSQL with the driver's process tree killed at each
point of an epoch."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from integration.connectors.jdbc.support import Names, sink_for, table_ids
from integration.connectors.kafka.realtime_job import RealTimeJobSpec, run_realtime_job
from integration.fixtures.kafka import create_topic, unique_name
from integration.fixtures.postgres import PgServer
from sparkeos.connectors.jdbc import PostgresSink
from sparkeos.connectors.jdbc.realtime import MARKS_SUFFIX
from sparkeos.core.errors import ConfigurationError
from sparkeos.core.faults import REALTIME_POINTS
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


def test_upserts_are_refused_in_real_time_mode(pg_server: PgServer, names: Names,
                                               tmp_path: Any) -> None:
    sink = sink_for(pg_server, names, mode="upsert", key=["id"])
    with pytest.raises(ConfigurationError, match="cannot write in real-time mode"):
        exactly_once_writer(sink, "rt", checkpoint_location=str(tmp_path))


@pytest.mark.chaos
def test_kafka_to_postgres_every_row_once_after_kills_at_each_point_of_an_epoch(
        kafka_bootstrap: str, pg_server: PgServer, names: Names, admin: Any,
        tmp_path: Any) -> None:
    source = unique_name(str(tmp_path), "seos-rt-pg")
    create_topic(kafka_bootstrap, source, partitions=2)
    with admin.cursor() as cur:
        cur.execute(f'CREATE TABLE "{names.table}" (id bigint, payload text)')
    spec = RealTimeJobSpec(bootstrap=kafka_bootstrap, input_topic=source, output_topic="",
                           checkpoint=os.path.join(tmp_path, "checkpoint"),
                           pg_dsn=pg_server.dsn, pg_table=names.table,
                           pg_marker_table=names.marker)
    try:
        for epoch, point in enumerate(REALTIME_POINTS, start=2):
            result = run_realtime_job(spec, fault=f"{point}@{epoch}")
            assert result.crashed, f"{point}@{epoch} did not fire:\n{result.tail()}"
            seen = Counter(table_ids(admin, names.table))
            assert all(count == 1 for count in seen.values()), (point, seen.most_common(3))
        result = run_realtime_job(spec)
        assert result.returncode == 0, result.tail()
        seen = Counter(table_ids(admin, names.table))
        assert sorted(seen) == list(range(spec.total))
        assert max(seen.values()) == 1, seen.most_common(3)
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{names.marker}{MARKS_SUFFIX}"')
