"""PostgreSQL and Kafka under one decision, on real Spark: the driver is killed at the
points of the group's protocol, one per run; after each restart's recovery both sinks
hold the same batches, and in the end every id exactly once in both."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import pytest

from integration.connectors.jdbc.support import Names, PgServer
from integration.fixtures.kafka import create_topic, unique_name
from sparkeos.connectors.kafka import read_topic
from sparkeos.testing.job import JobSpec, run_job, run_job_process, write_input

pytestmark = [pytest.mark.spark, pytest.mark.chaos]

FILES = [[1, 2, 3], [4, 5], [6, 7, 8], [9], [10, 11], [12, 13, 14], [15], [16, 17], [18]]
# after_first_commit: PostgreSQL (committed on the driver) has the batch, Kafka (in
# tasks) not yet: the window only recovery may close.
CRASHES = ["after_first_commit@1", "kill_driver_after_first_prepare@2", "after_all_commits@3"]
"""Where the two sinks can be split: a kill in phase 1, one with one member committed
and the other not, one after both committed. The other points are the protocol's, the
same for a group (tests/core/snapshot/test_group.py runs every point)."""


def pg_ids(admin: Any, table: str) -> list[int]:
    with admin.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (f'"{table}"',))
        if cur.fetchone()[0] is None:
            return []
        cur.execute(f'SELECT id FROM "{table}"')
        return sorted(r[0] for r in cur.fetchall())


def kafka_ids(bootstrap: str, topic: str) -> list[int]:
    return sorted(int(json.loads(m.value())["id"]) for m in read_topic(bootstrap, topic))


def test_pg_and_kafka_under_one_decision_survive_driver_kills(
        tmp_path: Any, pg_server: PgServer, names: Names, admin: Any,
        kafka_bootstrap: str) -> None:
    topic = unique_name(str(tmp_path))
    create_topic(kafka_bootstrap, topic, partitions=2)
    write_input(str(tmp_path / "in"), FILES)
    spec = JobSpec(
        input=str(tmp_path / "in"), checkpoint=str(tmp_path / "ckpt"), mode="function",
        name="group",
        sink={"factory": "integration.core.group_job:pg_and_kafka",
              "kwargs": {"dsn": pg_server.dsn, "table": names.table, "marker": names.marker,
                         "bootstrap": kafka_bootstrap, "topic": topic,
                         "staging_dir": str(tmp_path / "staging"),
                         "prefix": unique_name(str(tmp_path), "t") + "-"}})
    for fault in CRASHES:
        # Each run recovers the batch the run before was killed in, then dies at the
        # next point, one batch later: the batches before this one are whole in both.
        batch = int(fault.split("@")[1])
        result = run_job_process(spec, fault)
        assert result.crashed, f"{fault}: the driver was not killed\n{result.tail()}"
        before = sorted(i for f in FILES[:batch] for i in f)
        in_pg = [i for i in pg_ids(admin, names.table) if i in before]
        in_kafka = [i for i in kafka_ids(kafka_bootstrap, topic) if i in before]
        assert in_pg == in_kafka, f"before {fault}: {in_pg} != {in_kafka}"
        assert in_pg == before, fault
    result = run_job(spec)
    assert result.returncode == 0, result.tail()
    everything = sorted(i for f in FILES for i in f)
    in_pg, in_kafka = pg_ids(admin, names.table), kafka_ids(kafka_bootstrap, topic)
    assert in_pg == everything, Counter(in_pg)
    assert in_kafka == everything, Counter(in_kafka)
    assert not [n for n in os.listdir(tmp_path / "staging") if not n.startswith(".")]
