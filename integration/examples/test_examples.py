"""The scripts of examples/, run as a user runs them, against the real services.

Each test feeds an example's input, runs the script in a child process
(``--available-now``), Spark's word-count port once with a kill planned through
``SPARKEOS_FAULT`` first (the other shapes are killed at their points in the connector
suites, the STOMP source's tests, the sink group's and
integration/connectors/*/test_*_pipeline.py), restarts the script from its checkpoint
until a condition on the output (and the input queue) holds, and then counts the
output: every input id exactly once, or the exact count of every word. No check
waits on time; every loop ends on a condition, with a bound on the number of runs.
Each test removes what it created: topics, marker groups and progress records, tables
and marker rows, prepared transactions, queues, directories.

The fast test at the end checks that examples/README.md lists every script and that
each one answers ``--help``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sparkeos.core.faults import ENV_VAR, SOURCE_ENV
from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
from sparkeos.core.storage.logstores import open_store
from sparkeos.testing.conformance import assert_exactly_once
from sparkeos.testing.job import JobResult, again_if_worker_not_started, collect_job

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
RUN_TIMEOUT_S = 600.0
"""A bound on one run of a script (a normal run takes well under a minute)."""


# -- running a script ------------------------------------------------------------------------
@dataclass
class Example:
    """One script of examples/ with this test's environment and working directory."""

    script: str
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)

    def run(self, *args: str, kill: str | None = None) -> JobResult:
        """``python examples/<script> <args> --available-now`` in its own process group
        (killed whole afterwards: a killed driver leaves its JVM and workers behind).
        ``kill``: ``point@batch`` for ``SPARKEOS_FAULT``, ``source_*@n`` for
        ``SPARKEOS_SOURCE_FAULT``."""
        env = {**os.environ, **self.env}
        env.pop(ENV_VAR, None)
        env.pop(SOURCE_ENV, None)
        if kill:
            env[SOURCE_ENV if kill.startswith("source_") else ENV_VAR] = kill
        # What a killed driver leaves behind (Spark's scratch space, its JVM's and
        # Python's temporary files) stays in this test's directory.
        for name, sub in (("SPARK_LOCAL_DIRS", "spark-local"), ("TMPDIR", "tmp")):
            env[name] = str(self.workdir / sub)
            os.makedirs(env[name], exist_ok=True)
        env["SPARK_SUBMIT_OPTS"] = (env.get("SPARK_SUBMIT_OPTS", "")
                                    + f" -Djava.io.tmpdir={env['TMPDIR']}").strip()
        env.setdefault("PYSPARK_PYTHON", sys.executable)

        def once() -> JobResult:
            proc = subprocess.Popen(
                [sys.executable, str(EXAMPLES / self.script), *args, "--available-now"],
                cwd=self.workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, start_new_session=True)
            return collect_job(proc, RUN_TIMEOUT_S)

        return again_if_worker_not_started(once)

    def run_until_killed(self, *args: str, kill: str, tries: int = 3) -> None:
        """Run with ``kill`` planned until it happened. A STOMP run whose first pull
        found nothing ends normally before the point; it is run again."""
        for _ in range(tries):
            result = self.run(*args, kill=kill)
            if result.crashed:
                return
            assert result.returncode == 0, f"{self.script} failed:\n{result.tail()}"
        raise AssertionError(f"{kill} never killed {self.script}:\n{result.tail()}")

    def run_until(self, *args: str, done: Callable[[], bool], runs: int = 8) -> None:
        """Restart from the checkpoint until ``done()`` (each run must succeed)."""
        for _ in range(runs):
            result = self.run(*args)
            assert result.returncode == 0, f"{self.script} failed:\n{result.tail()}"
            if done():
                return
        raise AssertionError(f"{self.script}: not done after {runs} runs:\n{result.tail()}")


def query_key(checkpoint: Path, sink: str) -> str | None:
    """The query key sparkeos derived from the Spark query (names its IDs and markers):
    from the sink's commit log, else (a real-time writer keeps none) from Spark's
    checkpoint."""
    meta = None
    if (checkpoint / "sparkeos" / sink).is_dir():
        meta = CommitLog(open_store(sink_log_location(str(checkpoint), sink))).read_meta()
    if meta is None or "query_key" not in meta:  # a real-time writer's record has none
        from sparkeos.core.streaming.identity import of_checkpoint

        query = of_checkpoint(str(checkpoint))
        return query.key if query.durable else None
    return str(meta["query_key"])


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    work = tmp_path / "work"
    work.mkdir()
    yield work
    shutil.rmtree(tmp_path, ignore_errors=True)


# -- Kafka -------------------------------------------------------------------------------------
def tag() -> str:
    return uuid.uuid4().hex[:10]


class KafkaJanitor:
    """Creates this test's topics and removes them at the end, with the marker groups
    and progress records of every KafkaSink query it was told about."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.topics: list[str] = []
        self.queries: list[tuple[Path, str]] = []

    def topic(self, prefix: str, partitions: int = 2) -> str:
        from integration.fixtures.kafka import create_topic

        name = f"{prefix}-{tag()}"
        self.topics.append(name)
        create_topic(self.bootstrap, name, partitions)
        return name

    def sink_query(self, checkpoint: Path, sink: str) -> None:
        self.queries.append((checkpoint, sink))

    def clean(self) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient

        from sparkeos.connectors.kafka import read_topic
        from sparkeos.connectors.kafka.sink import (
            DEFAULT_MARKER_GROUP_PREFIX,
            DEFAULT_MARKER_TOPIC,
        )

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        stems = [f"{DEFAULT_MARKER_GROUP_PREFIX}{key}.{sink}." for checkpoint, sink in
                 self.queries if (key := query_key(checkpoint, sink))]
        if stems:
            listed = admin.list_consumer_groups(request_timeout=30).result()
            groups = [g.group_id for g in listed.valid if g.group_id.startswith(tuple(stems))]
            for future in admin.delete_consumer_groups(groups, request_timeout=30).values():
                future.result()
            # Tombstones: compaction then drops this test's progress records too.
            keys = {m.key() for m in read_topic(self.bootstrap, DEFAULT_MARKER_TOPIC,
                                                timeout_s=120)
                    if (m.key() or b"").decode(errors="replace").startswith(tuple(stems))}
            producer = Producer({"bootstrap.servers": self.bootstrap})
            for key in keys:
                producer.produce(DEFAULT_MARKER_TOPIC, None, key, partition=0)
            assert producer.flush(30) == 0
        if self.topics:
            for future in admin.delete_topics(self.topics, operation_timeout=30).values():
                future.result()


@pytest.fixture
def kafka(kafka_bootstrap: str, workdir: Path) -> Iterator[KafkaJanitor]:
    """Cleans up before ``workdir`` goes: it reads the query keys in the checkpoints."""
    janitor = KafkaJanitor(kafka_bootstrap)
    yield janitor
    janitor.clean()


def produce(bootstrap: str, topic: str, values: list[str], aborted: Sequence[str] = ()) -> None:
    """``values`` in committed transactions of 10, each followed by an aborted one
    holding one of ``aborted`` (a read_committed reader never sees those)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-up"})
    producer.init_transactions(30)
    for n, start in enumerate(range(0, len(values), 10)):
        producer.begin_transaction()
        for value in values[start:start + 10]:
            producer.produce(topic, value.encode())
        producer.commit_transaction(30)
        if n < len(aborted):
            producer.begin_transaction()
            producer.produce(topic, aborted[n].encode())
            producer.flush(30)
            producer.abort_transaction(30)


def topic_json(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    from sparkeos.connectors.kafka import read_topic

    return [json.loads(m.value()) for m in read_topic(bootstrap, topic, timeout_s=60)]


# -- the examples --------------------------------------------------------------------------------
@pytest.mark.chaos
def test_kafka_to_kafka(kafka: KafkaJanitor, workdir: Path) -> None:
    source, target = kafka.topic("seos-ex-orders"), kafka.topic("seos-ex-cents")
    ids = list(range(80))
    produce(kafka.bootstrap, source, [json.dumps({"id": i, "amount": i * 1.5}) for i in ids],
            aborted=[json.dumps({"id": 900_000 + n, "amount": 1.0}) for n in range(4)])
    checkpoint = workdir / "checkpoint"
    kafka.sink_query(checkpoint, "orders-cents")
    example = Example("kafka_to_kafka.py", workdir, {
        "SPARKEOS_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "SPARKEOS_KAFKA_STAGING_DIR": str(workdir / "staging")})
    args = ("--input", source, "--output", target, "--checkpoint", str(checkpoint),
            "--max-per-batch", "16")
    # No kill: Kafka -> Spark -> Kafka is killed at its points in
    # integration/connectors/kafka/test_kafka_pipeline.py.
    example.run_until(*args, done=lambda: {r["id"] for r in topic_json(
        kafka.bootstrap, target)} >= set(ids))
    out = topic_json(kafka.bootstrap, target)
    assert_exactly_once([r["id"] for r in out], ids)
    assert all(r["amount_cents"] == r["id"] * 150 for r in out), out[:5]


@pytest.mark.chaos
def test_realtime_kafka_to_kafka(kafka: KafkaJanitor, workdir: Path) -> None:
    """Real-time mode (issue 52): run until the output holds every order, each once, to
    a read_committed reader. No kill: the writer is killed at every point of an epoch,
    at a random moment and in a Python worker by
    integration/connectors/kafka/test_kafka_realtime.py."""
    source, target = kafka.topic("seos-ex-rt-orders"), kafka.topic("seos-ex-rt-cents")
    ids = list(range(60))
    produce(kafka.bootstrap, source, [json.dumps({"id": i, "amount": i * 1.5}) for i in ids],
            aborted=[json.dumps({"id": 900_000 + n, "amount": 1.0}) for n in range(3)])
    checkpoint = workdir / "checkpoint"
    kafka.sink_query(checkpoint, "orders-cents")
    example = Example("realtime_kafka_to_kafka.py", workdir,
                      {"SPARKEOS_KAFKA_BOOTSTRAP": kafka.bootstrap})
    args = ("--input", source, "--output", target, "--checkpoint", str(checkpoint),
            "--epoch-seconds", "1")
    example.run_until(*args, done=lambda: {r["id"] for r in topic_json(
        kafka.bootstrap, target)} >= set(ids))
    out = topic_json(kafka.bootstrap, target)
    assert_exactly_once([r["id"] for r in out], ids)
    assert all(r["amount_cents"] == r["id"] * 150 for r in out), out[:5]


@pytest.mark.chaos
def test_files_to_parquet(workdir: Path) -> None:
    from sparkeos.connectors.file import read_output
    from sparkeos.testing.job import write_input

    incoming, output = workdir / "incoming", workdir / "orders"
    ids = write_input(str(incoming), [range(f * 100, f * 100 + 20) for f in range(6)])
    example = Example("files_to_parquet.py", workdir)
    args = ("--input", str(incoming), "--output", str(output),
            "--checkpoint", str(workdir / "checkpoint"), "--max-files-per-batch", "1")

    def visible() -> list[int]:
        if not output.is_dir():
            return []
        return [int(i) for i in read_output(str(output), "parquet").column("id").to_pylist()]

    # No kill: the file sink is killed at every point by its conformance suite.
    example.run_until(*args, done=lambda: set(visible()) >= set(ids))
    assert_exactly_once(visible(), ids)
    table = read_output(str(output), "parquet")
    assert table.column("payload_length").to_pylist() == [
        len(p) for p in table.column("payload").to_pylist()]


@pytest.mark.chaos
def test_stomp_to_kafka(kafka: KafkaJanitor, artemis_url: str, local_artemis: bool,
                        workdir: Path) -> None:
    from integration.stomp_helpers import drain, queue_depth_artemis, send

    queue = f"seos-ex-in-{tag()}"
    target = kafka.topic("seos-ex-from-stomp")
    ids = list(range(120))
    send(artemis_url, queue, [json.dumps({"id": i}) for i in ids])
    checkpoint = workdir / "checkpoint"
    kafka.sink_query(checkpoint, "stomp-to-kafka")
    example = Example("stomp_to_kafka.py", workdir, {
        "SPARKEOS_STOMP_URL": artemis_url, "SPARKEOS_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "SPARKEOS_KAFKA_STAGING_DIR": str(workdir / "staging"),
        "SPARKEOS_STOMP_SPOOL_DIR": str(workdir / "spool")})
    args = ("--queue", queue, "--output", target, "--checkpoint", str(checkpoint),
            "--max-per-batch", "30")

    def depth() -> int | None:
        if not local_artemis:
            return None
        try:
            return queue_depth_artemis(queue, artemis_url)
        except LookupError:
            return 0  # drained and removed by the broker

    def done() -> bool:
        complete = {r["id"] for r in topic_json(kafka.bootstrap, target)} >= set(ids)
        return complete and depth() in (0, None)

    try:
        # No kill: the STOMP source is killed at its points in
        # integration/connectors/stomp/test_stomp_source.py, the Kafka sink at its own in
        # its conformance suite.
        example.run_until(*args, done=done, runs=12)
        assert_exactly_once([r["id"] for r in topic_json(kafka.bootstrap, target)], ids)
        pulls = workdir / "spool" / queue / "pulls"
        assert not pulls.is_dir() or not os.listdir(pulls), os.listdir(pulls)
    finally:
        if depth() != 0:  # a failed run left messages behind (auto-deleted once empty)
            drain(artemis_url, queue, idle=2.0, timeout=120.0)


@pytest.mark.chaos
def test_wordcount_to_postgres(kafka: KafkaJanitor, pg_server: Any, workdir: Path) -> None:
    """The running word count of issue 13: update-mode counts upserted exactly once
    (needs PostgresSink(mode="upsert") under exactly_once)."""
    import psycopg2

    rng = random.Random(13)
    vocabulary = ["spark", "kafka", "postgres", "exactly", "once", "upsert", "word", "count"]
    lines = [" ".join(rng.choices(vocabulary, k=rng.randint(1, 6))) for _ in range(100)]
    expected = Counter(w for line in lines for w in line.split())
    source = kafka.topic("seos-ex-lines")
    produce(kafka.bootstrap, source, lines, aborted=["aborted aborted aborted"] * 3)
    table, checkpoint = f"wordcount_{tag()}", workdir / "checkpoint"
    example = Example("wordcount_to_postgres.py", workdir, {
        "SPARKEOS_KAFKA_BOOTSTRAP": kafka.bootstrap, "SPARKEOS_POSTGRES_DSN": pg_server.dsn})
    args = ("--input", source, "--table", table, "--checkpoint", str(checkpoint),
            "--max-per-batch", "16")

    def counts() -> dict[str, int]:
        with psycopg2.connect(pg_server.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (f'"{table}"',))
            if cur.fetchone()[0] is None:
                return {}
            cur.execute(f'SELECT word, "count" FROM "{table}"')
            found = {str(w): int(n) for w, n in cur.fetchall()}
        conn.close()
        return found

    try:
        # No kill: update-mode upserts are killed in
        # integration/connectors/jdbc/test_postgres_wordcount.py.
        example.run_until(*args, done=lambda: counts() == dict(expected))
        assert counts() == dict(expected)
        assert_markers_once(pg_server.dsn, checkpoint, "wordcount")
    finally:
        clean_postgres(pg_server.dsn, table, query_key(checkpoint, "wordcount"))


@pytest.mark.chaos
def test_spark_kafka_wordcount_port(kafka: KafkaJanitor, workdir: Path) -> None:
    """Issue 26: Spark's structured_kafka_wordcount.py writing to Kafka through
    format("sparkeos-kafka") in complete mode, the driver killed from a task in phase 1
    (the format's other points are its conformance suite's), then restarted: the last
    count of every word is exact, and
    the output holds each batch's table once (as many records as the commit log says
    its batches decided, read back by a read_committed consumer)."""
    from sparkeos.connectors.kafka import read_topic

    rng = random.Random(26)
    vocabulary = ["spark", "kafka", "format", "exactly", "once", "complete", "word"]
    lines = [" ".join(rng.choices(vocabulary, k=rng.randint(1, 6))) for _ in range(60)]
    expected = Counter(w for line in lines for w in line.split())
    source, target = kafka.topic("seos-ex-wc-lines"), kafka.topic("seos-ex-wc-counts")
    produce(kafka.bootstrap, source, lines)
    checkpoint = workdir / "checkpoint"
    kafka.sink_query(checkpoint, "sink")
    example = Example("structured_kafka_wordcount.py", workdir,
                      {"SPARKEOS_WORDCOUNT_MAX_OFFSETS": "20"})  # 3 batches
    args = (kafka.bootstrap, "subscribe", source, target, str(checkpoint))

    def records() -> list[tuple[str, int]]:
        return [(m.key().decode(), int(m.value())) for m in
                read_topic(kafka.bootstrap, target, timeout_s=60, open_transactions="fail")]

    def last_counts() -> dict[str, int]:
        last: dict[str, int] = {}
        for word, count in records():  # one partition per word, in offset order
            last[word] = count
        return last

    example.run_until_killed(*args, kill="kill_driver_after_first_prepare@1")
    example.run_until(*args, done=lambda: last_counts() == dict(expected))
    log = CommitLog(open_store(sink_log_location(str(checkpoint), "sink")))
    states = log.batches()
    assert all(s.finished is not None for s in states.values()), states
    decided = sum(int(s.decided["rows"]) for s in states.values() if s.decided)
    assert len(records()) == decided, "a batch's table was published twice, or not at all"
    assert any(s.aborted for s in states.values()), "the kill in phase 1 left no aborted run"


@pytest.mark.chaos
def test_kafka_to_postgres_and_kafka(kafka: KafkaJanitor, pg_server: Any,
                                     workdir: Path) -> None:
    """One decision across two sinks: every order once in the table and once in the
    topic (the group is killed between its members' commits, among other points, in
    integration/core/test_sink_group.py)."""
    import psycopg2

    source, events = kafka.topic("seos-ex-orders"), kafka.topic("seos-ex-events")
    ids = list(range(60))
    produce(kafka.bootstrap, source, [json.dumps({"id": i, "amount": i * 2.0}) for i in ids])
    table, checkpoint = f"orders_{tag()}", workdir / "checkpoint"
    kafka.sink_query(checkpoint, "orders")
    example = Example("kafka_to_postgres_and_kafka.py", workdir, {
        "SPARKEOS_KAFKA_BOOTSTRAP": kafka.bootstrap, "SPARKEOS_POSTGRES_DSN": pg_server.dsn,
        "SPARKEOS_KAFKA_STAGING_DIR": str(workdir / "staging")})
    args = ("--input", source, "--table", table, "--events", events,
            "--checkpoint", str(checkpoint), "--max-per-batch", "12")

    def in_table() -> list[int]:
        found: list[int] = []
        with psycopg2.connect(pg_server.dsn) as conn, conn.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (f'"{table}"',))
            if cur.fetchone()[0] is not None:
                cur.execute(f'SELECT id FROM "{table}"')
                found = [int(r[0]) for r in cur.fetchall()]
        conn.close()
        return sorted(found)

    def in_topic() -> list[int]:
        return sorted(int(r["id"]) for r in topic_json(kafka.bootstrap, events))

    try:
        example.run_until(*args, done=lambda: set(in_table()) >= set(ids))
        assert_exactly_once(in_table(), ids)
        assert_exactly_once(in_topic(), ids)
    finally:
        clean_postgres(pg_server.dsn, table, query_key(checkpoint, "orders"))


@pytest.mark.chaos
def test_kafka_to_delta_and_kafka(kafka: KafkaJanitor, workdir: Path) -> None:
    """The outbox: the driver's whole process tree killed with the table's commit of
    batch 1 done and the topic's not; the restart's recovery commits the topic's, and in
    the end every order once in the table and its event once in the topic. (Every other
    point, in process against the same table and broker:
    integration/core/test_outbox_group.py.)"""
    pytest.importorskip("deltalake")
    from deltalake import DeltaTable

    source, events = kafka.topic("seos-ex-orders"), kafka.topic("seos-ex-events")
    ids = list(range(36))
    produce(kafka.bootstrap, source, [json.dumps({"id": i, "amount": i * 2.0}) for i in ids])
    table, checkpoint = workdir / "orders", workdir / "checkpoint"
    kafka.sink_query(checkpoint, "outbox")
    example = Example("kafka_to_delta_and_kafka.py", workdir, {
        "SPARKEOS_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "SPARKEOS_KAFKA_STAGING_DIR": str(workdir / "staging")})
    args = ("--input", source, "--table", str(table), "--events", events,
            "--checkpoint", str(checkpoint), "--max-per-batch", "12")

    def in_table() -> list[int]:
        if not DeltaTable.is_deltatable(str(table)):
            return []
        column = DeltaTable(str(table)).to_pyarrow_table(columns=["id"]).column("id")
        return sorted(int(i) for i in column.to_pylist())

    def in_topic() -> list[int]:
        return sorted(int(r["id"]) for r in topic_json(kafka.bootstrap, events))

    example.run_until_killed(*args, kill="after_first_commit@1")
    assert len(in_table()) > len(in_topic()), "the kill did not split the two commits"
    example.run_until(*args, done=lambda: set(in_table()) >= set(ids))
    assert_exactly_once(in_table(), ids)
    assert_exactly_once(in_topic(), ids)


def assert_markers_once(dsn: str, checkpoint: Path, sink: str) -> None:
    """Every decided batch committed once: its marker rows name one transaction per
    partition, and no marker belongs to a batch that was never decided."""
    import psycopg2

    key = query_key(checkpoint, sink)
    log = CommitLog(open_store(sink_log_location(str(checkpoint), sink)))
    decided = {b: s.decided for b, s in log.batches().items() if s.decided is not None}
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute('SELECT batch_id, "partition", count(*) FROM sparkeos_markers '
                    "WHERE query_key = %s AND sink = %s GROUP BY 1, 2", (key, sink))
        rows = cur.fetchall()
    conn.close()
    twice = [(b, p) for b, p, n in rows if n != 1]
    assert not twice, f"(batch, partition) committed more than once: {twice}"
    marked = {int(b) for b, _p, _n in rows}
    assert decided and marked == set(decided), (
        f"batches with markers {sorted(marked)} != decided batches {sorted(decided)}")
    for batch, record in decided.items():
        partitions = {int(p["partition"]) for p in record["participants"]}
        assert {int(p) for b, p, _n in rows if b == batch} <= partitions, batch


def clean_postgres(dsn: str, table: str, key: str | None) -> None:
    import psycopg2

    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        if key is not None:
            cur.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s",
                        (f"seos-{key}-%",))
            for (gid,) in cur.fetchall():
                cur.execute("ROLLBACK PREPARED %s", (gid,))
            cur.execute("SELECT to_regclass('sparkeos_markers')")
            if cur.fetchone()[0] is not None:
                cur.execute("DELETE FROM sparkeos_markers WHERE query_key = %s", (key,))
        cur.execute("SET lock_timeout = '20s'")
        cur.execute(f'DROP TABLE IF EXISTS "{table}"')
    conn.close()


# -- the list --------------------------------------------------------------------------------------
def test_every_example_is_listed_short_and_answers_help() -> None:
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert scripts, "no examples"
    listed = (EXAMPLES / "README.md").read_text()
    tested = set(re.findall(r'Example\("(\w+\.py)"', Path(__file__).read_text()))
    for name in scripts:
        text = (EXAMPLES / name).read_text()
        assert f"examples/{name}" in listed, f"{name} missing from examples/README.md"
        assert name in tested, f"{name} has no test here"
        assert text.startswith('"""') and f"examples/{name}" in text.split('"""')[1], (
            f"{name}: the module docstring says how to run it")
        assert len(text.splitlines()) <= 70, f"{name} is no longer short"
        done = subprocess.run([sys.executable, str(EXAMPLES / name), "--help"], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "--available-now" in done.stdout, done.stderr
    assert "examples/README.md" in (REPO / "README.md").read_text()
