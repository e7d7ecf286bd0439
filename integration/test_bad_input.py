"""The bad-input catalogue: a user's mistakes against the real services, one case each.

Every case makes the mistake, checks the exact error type, that the message names the
cause and the fix, and that nothing was written or duplicated; then applies the fix and
checks every row lands exactly once. ``CASES`` is also the source of the
troubleshooting table in docs/operations.md (``test_the_docs_table_matches``).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from sparkeos.connectors.file import FileSink, read_output
from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import (
    CommitLogError,
    ConfigurationError,
    QueryRunningError,
    RetriableError,
    SchemaMismatchError,
    SparkEOSError,
    TransactionAbortedError,
    TransactionIdCollisionError,
)
from sparkeos.core.snapshot.commitlog import OUTCOME, CommitLog, record_name
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.storage.logstores import LocalStore
from sparkeos.core.storage.registry import split_uri
from sparkeos.core.streaming.adapter import ForeachBatchAdapter, claim_sink_name
from sparkeos.testing.conformance import assert_exactly_once
from sparkeos.testing.inprocess import ListRunner

REPO = Path(__file__).resolve().parents[1]
ROWS = [[1, 2], [3]]
EXPECTED = [1, 2, 3]


@dataclass(frozen=True)
class Case:
    id: str
    mistake: str
    error: type[SparkEOSError] | None
    cause: str
    """Text the message must contain: it names the cause."""
    fix: str
    """Text the "What to do" part must contain."""
    remedy: str
    """What the user does (for the docs' table)."""


CASES = [
    Case("kafka-unreachable", "Kafka brokers down or bootstrap_servers wrong",
         RetriableError, "did not answer", "start the brokers",
         "start the brokers or fix `bootstrap_servers`; restart"),
    Case("kafka-unknown-topic", "output topic missing, automatic creation off",
         ConfigurationError, "does not exist", "create it",
         "create the topic (or fix `topic=` / the topic column); restart"),
    Case("kafka-timeout-above-max", "`transaction_timeout_ms` above the brokers' maximum",
         ConfigurationError, "transaction.max.timeout.ms", "transaction_timeout_ms",
         "lower `transaction_timeout_ms` or raise `transaction.max.timeout.ms`"),
    Case("kafka-marker-topic-not-compacted", "the marker topic is not compacted",
         ConfigurationError, "cleanup.policy", "cleanup.policy=compact",
         "set `cleanup.policy=compact` on the marker topic"),
    Case("pg-unreachable", "PostgreSQL down or host/port wrong", RetriableError,
         "failed", "check that the server is up", "start the server or fix the DSN"),
    Case("pg-unknown-database", "DSN names a database that does not exist",
         ConfigurationError, "refused the connection", "database name",
         "fix `dbname` in the DSN (or create the database)"),
    Case("pg-auth-failure", "DSN user unknown or password wrong", ConfigurationError,
         "refused the connection", "user or password",
         "fix the user/password, or pg_hba.conf"),
    Case("pg-missing-table", "the table does not exist (creation off)", ConfigurationError,
         "does not exist", "create_table=True",
         "create it, or `create_table=True` (formats: `sparkeos.createTable`, on by "
         "default)"),
    Case("pg-type-mismatch", "a DataFrame column does not fit the table's type",
         SchemaMismatchError, "does not fit column type", "cast",
         "cast the column in the DataFrame, or alter the table"),
    Case("pg-constraint-mid-batch", "a row violates a constraint (CHECK, unique)",
         TransactionAbortedError, "violates check constraint",
         "fix the data or the table's constraint",
         "fix the data or the constraint; restart: the batch is written again"),
    Case("pg-prepared-pool-full", "`max_prepared_transactions` used up (orphans)",
         ConfigurationError, "are in use", "sparkeos recover",
         "recover or roll back the orphans it names; or raise the limit"),
    Case("file-not-writable", "output directory not writable", ConfigurationError,
         "not writable", "write access", "fix permissions or choose another path"),
    Case("file-path-is-a-file", "output path is a file", ConfigurationError,
         "not writable", "write access", "remove the file or choose another path"),
    Case("file-not-shared", "output directory not shared by driver and executors",
         ConfigurationError, "is not shared", "same path",
         "use a shared mount at the same path everywhere, or HDFS"),
    Case("file-on-object-store",
         "output or staging on an object store sparkeos does not write (`oss://`)",
         ConfigurationError, "conditional writes", "s3a://",
         "S3 (`s3a://`), GCS (`gs://`), Azure Blob (`abfss://`), HDFS or a shared mount"),
    Case("s3-without-conditional-writes",
         "an object store that ignores its create-if-absent precondition",
         ConfigurationError, "does not honour conditional writes", "conditional writes",
         "a store with conditional writes (S3, GCS, Azure Blob, MinIO, R2, Ceph RGW), or "
         "HDFS"),
    Case("hdfs-unreachable", "HDFS NameNode unreachable (WebHDFS)", RetriableError,
         "cannot be reached", "SPARKEOS_WEBHDFS_PORT",
         "start it, or set `SPARKEOS_WEBHDFS_PORT` / use `webhdfs://host:<http port>`"),
    Case("no-checkpoint", "the query has no `checkpointLocation`", ConfigurationError,
         "no checkpointLocation", "checkpointLocation",
         "set `.option(\"checkpointLocation\", ...)`"),
    Case("lost-checkpoint", "checkpoint lost or replaced, output kept",
         ConfigurationError, "another query", "restore the checkpoint",
         "restore the checkpoint; or start anew with `existing_output='accept'`"),
    Case("two-queries-one-checkpoint", "another query's commit log under this name",
         TransactionIdCollisionError, "another query id", "own checkpointLocation",
         "one checkpoint per query, one name per sink"),
    Case("same-name-twice", "two sinks of one query given the same name",
         ConfigurationError, "both named", "its own name=",
         "give each sink its own `name=`"),
    Case("schema-change", "the DataFrame's schema changed between batches",
         SchemaMismatchError, "schema differs", "new sink name",
         "select/cast back, or a new sink name"),
    Case("refused-first-batch", "the first batch is refused (wrong types), then fixed",
         SchemaMismatchError, "does not fit", "cast",
         "fix the query; a refused batch pins nothing"),
    Case("empty-batches", "empty batches and empty partitions", None, "", "",
         "nothing to do: committed with no rows"),
    Case("corrupt-log-record", "a commit-log record edited or truncated", CommitLogError,
         "not valid JSON", "restore it from a backup",
         "restore the checkpoint from a backup"),
    Case("cli-not-a-checkpoint", "`sparkeos status` on a directory that is no checkpoint",
         ConfigurationError, "no sparkeos sinks", "checkpointLocation",
         "pass the query's `checkpointLocation`"),
    Case("recover-while-running", "`sparkeos recover` while the query runs",
         QueryRunningError, "holds the lease", "--force",
         "stop the query first (or `--force` if its driver is gone)"),
    Case("task-attempts-out-of-range", "`task_attempts` below Spark's retries",
         ConfigurationError, "outside the range", "task_attempts",
         "raise `task_attempts` above `spark.task.maxFailures`"),
]


def expect(case: Case, action: Callable[[], Any]) -> SparkEOSError:
    assert case.error is not None
    with pytest.raises(case.error) as info:
        action()
    message = str(info.value)
    assert case.cause in message, f"{case.id}: cause missing from: {message}"
    assert "What to do:" in message and case.fix in message.split("What to do:", 1)[1], (
        f"{case.id}: fix missing from: {message}")
    return info.value


class World:
    """What the scenarios share: a fresh directory, the services, an in-process run."""

    def __init__(self, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.tmp = tmp_path
        self.request = request
        self.tag = uuid.uuid4().hex[:8]
        self.log = CommitLog(LocalStore(str(tmp_path / "log")))

    def fixture(self, name: str) -> Any:
        return self.request.getfixturevalue(name)

    def coordinator(self, sink: Any, **settings: Any) -> Coordinator:
        return Coordinator(sink, CoordinatorConfig(name="cat", **settings), self.log, "catq")

    def run(self, sink: Any, rows: list[list[int]] = ROWS, batch_id: int = 0,
            **settings: Any) -> Any:
        return self.coordinator(sink, **settings).run_batch(batch_id, ListRunner(rows))


# -- Kafka ------------------------------------------------------------------------------------
def _kafka_ids(bootstrap: str, topic: str) -> list[int]:
    from sparkeos.connectors.kafka import read_topic

    return [int(json.loads(m.value())["id"]) for m in read_topic(bootstrap, topic)]


def _kafka_sink(w: World, bootstrap: str, topic: str, **kwargs: Any) -> Any:
    from sparkeos.connectors.kafka import KafkaSink

    settings = {"staging_dir": str(w.tmp / "staging"), "timeout_s": 10.0,
                "transactional_id_prefix": f"cat-{w.tag}-"}
    return KafkaSink(bootstrap, topic=topic, **{**settings, **kwargs})


def kafka_unreachable(w: World, case: Case) -> None:
    bootstrap = w.fixture("kafka_bootstrap")
    topic = f"cat-{w.tag}"
    expect(case, lambda: w.run(_kafka_sink(w, "127.0.0.1:1", topic, timeout_s=2.0)))
    assert not w.log.batches()
    w.run(_kafka_sink(w, bootstrap, topic))
    assert_exactly_once(_kafka_ids(bootstrap, topic), EXPECTED)


def kafka_unknown_topic(w: World, case: Case) -> None:
    from integration.fixtures.kafka import create_topic

    bootstrap = w.fixture("strict_kafka")
    topic = f"cat-{w.tag}"
    expect(case, lambda: w.run(_kafka_sink(w, bootstrap, topic)))
    create_topic(bootstrap, topic, partitions=1)
    w.run(_kafka_sink(w, bootstrap, topic))
    assert_exactly_once(_kafka_ids(bootstrap, topic), EXPECTED)


def kafka_timeout_above_max(w: World, case: Case) -> None:
    bootstrap = w.fixture("kafka_bootstrap")
    topic = f"cat-{w.tag}"
    too_long = _kafka_sink(w, bootstrap, topic, transaction_timeout_ms=3_600_000)
    expect(case, lambda: w.run(too_long))
    assert _kafka_ids(bootstrap, topic) == []
    w.run(_kafka_sink(w, bootstrap, topic))
    assert_exactly_once(_kafka_ids(bootstrap, topic), EXPECTED)


def kafka_marker_topic_not_compacted(w: World, case: Case) -> None:
    from integration.fixtures.kafka import create_topic

    bootstrap = w.fixture("kafka_bootstrap")
    topic, markers = f"cat-{w.tag}", f"cat-markers-{w.tag}"
    create_topic(bootstrap, markers, partitions=1)  # delete policy, the broker default
    expect(case, lambda: w.run(_kafka_sink(w, bootstrap, topic, marker_topic=markers)))
    assert _kafka_ids(bootstrap, topic) == []
    w.run(_kafka_sink(w, bootstrap, topic, marker_topic=f"cat-markers2-{w.tag}"))
    assert_exactly_once(_kafka_ids(bootstrap, topic), EXPECTED)


# -- PostgreSQL --------------------------------------------------------------------------------
def _pg(w: World) -> tuple[Any, Any]:
    return w.fixture("pg_server"), w.fixture("names")


def _pg_sink(w: World, dsn: str | None = None, **kwargs: Any) -> Any:
    from sparkeos.connectors.jdbc import PostgresSink

    server, names = _pg(w)
    settings = {"table": names.table, "marker_table": names.marker, "create_table": True,
                "connect_timeout_s": 5}
    return PostgresSink(dsn=dsn or server.dsn, **{**settings, **kwargs})


def _pg_ids(w: World) -> list[int]:
    from integration.connectors.jdbc.support import table_ids

    admin = w.fixture("admin")
    with admin.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", (f'"{_pg(w)[1].table}"',))
        if cur.fetchone()[0] is None:
            return []
    return table_ids(admin, _pg(w)[1].table)


def _dsn_with(w: World, **changes: str) -> str:
    from sparkeos.connectors.jdbc.dsn import parse

    params = {**parse(_pg(w)[0].dsn), **changes}
    return " ".join(f"{k}={v}" for k, v in params.items())


def pg_unreachable(w: World, case: Case) -> None:
    expect(case, lambda: w.run(_pg_sink(w, dsn="postgresql://app@127.0.0.1:1/db",
                                        connect_timeout_s=2)))
    w.run(_pg_sink(w))
    assert_exactly_once(_pg_ids(w), EXPECTED)


def pg_unknown_database(w: World, case: Case) -> None:
    expect(case, lambda: w.run(_pg_sink(w, dsn=_dsn_with(w, dbname=f"nodb_{w.tag}"))))
    assert not w.log.batches()
    w.run(_pg_sink(w))
    assert_exactly_once(_pg_ids(w), EXPECTED)


def pg_auth_failure(w: World, case: Case) -> None:
    expect(case, lambda: w.run(_pg_sink(w, dsn=_dsn_with(w, user=f"nobody_{w.tag}"))))
    w.run(_pg_sink(w))
    assert_exactly_once(_pg_ids(w), EXPECTED)


def pg_missing_table(w: World, case: Case) -> None:
    expect(case, lambda: w.run(_pg_sink(w, create_table=False)))
    assert _pg_ids(w) == []
    w.run(_pg_sink(w, create_table=True))
    assert_exactly_once(_pg_ids(w), EXPECTED)


def pg_type_mismatch(w: World, case: Case) -> None:
    from sparkeos.testing.inprocess import ArrowRunner, id_batch

    admin, table = w.fixture("admin"), _pg(w)[1].table
    with admin.cursor() as cur:
        cur.execute(f'CREATE TABLE "{table}" (id bigint, payload bigint)')
    runner = ArrowRunner([id_batch([1, 2]), id_batch([3])])  # payload is text
    expect(case, lambda: w.coordinator(_pg_sink(w)).run_batch(0, runner))
    assert _pg_ids(w) == []
    with admin.cursor() as cur:
        cur.execute(f'ALTER TABLE "{table}" ALTER COLUMN payload TYPE text')
    w.run(_pg_sink(w))
    assert_exactly_once(_pg_ids(w), EXPECTED)


def pg_constraint_mid_batch(w: World, case: Case) -> None:
    admin, table = w.fixture("admin"), _pg(w)[1].table
    with admin.cursor() as cur:
        cur.execute(f'CREATE TABLE "{table}" (id bigint CHECK (id < 3), payload text)')
    expect(case, lambda: w.run(_pg_sink(w)))
    assert _pg_ids(w) == []  # partition 0's rows were prepared, then rolled back
    with admin.cursor() as cur:
        cur.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT "{table}_id_check"')
    w.run(_pg_sink(w))
    assert_exactly_once(_pg_ids(w), EXPECTED)


def pg_prepared_pool_full(w: World, case: Case) -> None:
    import psycopg2

    from integration.connectors.jdbc.support import table_ids

    # A private server with a small pool: filling the shared one would starve other
    # tests' sinks (./run test runs two pytest workers).
    dsn = w.fixture("tiny_server")(4)
    names = _pg(w)[1]
    orphans: list[Any] = []
    prepared: list[str] = []
    admin = psycopg2.connect(dsn)
    admin.autocommit = True

    def written() -> list[int]:
        with admin.cursor() as cur:
            cur.execute("SELECT to_regclass(%s)", (f'"{names.table}"',))
            exists = cur.fetchone()[0] is not None
        return table_ids(admin, names.table) if exists else []

    def roll_back_orphans() -> None:
        with admin.cursor() as cur:
            while prepared:
                cur.execute(f"ROLLBACK PREPARED '{prepared.pop()}'")

    try:
        for i in range(4):  # another tool's forgotten prepared transactions
            conn = psycopg2.connect(dsn)
            orphans.append(conn)
            with conn.cursor() as cur:
                cur.execute("BEGIN")
                cur.execute("SELECT 1")
                cur.execute(f"PREPARE TRANSACTION 'orphan-{w.tag}-{i}'")
            prepared.append(f"orphan-{w.tag}-{i}")
        expect(case, lambda: w.run(_pg_sink(w, dsn)))
        roll_back_orphans()
        assert written() == []
        w.run(_pg_sink(w, dsn))
        assert_exactly_once(written(), EXPECTED)
    finally:
        roll_back_orphans()
        with admin.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{names.table}", "{names.marker}"')
        for conn in orphans:
            conn.close()
        admin.close()


# -- files, checkpoints, the commit log ----------------------------------------------------------
def _file_ids(path: Path) -> list[int]:
    table = read_output(str(path))
    return table.column("id").to_pylist() if table.num_rows else []


def file_not_writable(w: World, case: Case) -> None:
    # /proc refuses new directories even to root (tests may run as root).
    expect(case, lambda: w.run(FileSink(f"/proc/sparkeos-{w.tag}")))
    assert not w.log.batches()
    out = w.tmp / "out"  # the fix: a writable path
    w.run(FileSink(str(out)))
    assert_exactly_once(_file_ids(out), EXPECTED)


def file_path_is_a_file(w: World, case: Case) -> None:
    blocker = w.tmp / "out"
    blocker.write_text("a file where the output directory should be")
    expect(case, lambda: w.run(FileSink(str(blocker / "data"))))
    blocker.unlink()
    w.run(FileSink(str(blocker / "data")))
    assert_exactly_once(_file_ids(blocker / "data"), EXPECTED)


def file_not_shared(w: World, case: Case) -> None:
    from sparkeos.core.storage.fsutil import MARK_PREFIX

    out = w.tmp / "out"

    class ExecutorElsewhere(FileSink):
        def begin(self, txn: Any) -> Any:
            for mark in (out / ".sparkeos-staging").glob(MARK_PREFIX + "*"):
                mark.unlink()
            return super().begin(txn)

    expect(case, lambda: w.run(ExecutorElsewhere(str(out))))
    assert _file_ids(out) == []
    w.run(FileSink(str(out)))
    assert_exactly_once(_file_ids(out), EXPECTED)


def file_on_object_store(w: World, case: Case) -> None:
    expect(case, lambda: FileSink("oss://bucket/out"))  # refused at construction
    out = w.tmp / "out"
    w.run(FileSink(str(out)))
    assert_exactly_once(_file_ids(out), EXPECTED)


def s3_without_conditional_writes(w: World, case: Case) -> None:
    weak = w.fixture("s3_without_conditional_writes")
    with mock.patch.dict(os.environ, {"AWS_ENDPOINT_URL_S3": weak.endpoint}):
        out = f"s3a://{weak.bucket}/bad-input-{w.tag}/out"
        expect(case, lambda: w.run(FileSink(out)))  # refused before the first batch
        assert not w.log.batches()
        assert split_uri(out)[0].listdir(f"/bad-input-{w.tag}") == [], "written to"
    s3 = w.fixture("s3")  # the fix: a store with conditional writes
    out = s3.fresh_dir("bad-input-s3") + "/out"
    try:
        w.run(FileSink(out))
        assert_exactly_once(read_output(out).column("id").to_pylist(), EXPECTED)
    finally:
        s3.delete(out.rsplit("/", 1)[0])


def hdfs_unreachable(w: World, case: Case) -> None:
    expect(case, lambda: w.run(FileSink("webhdfs://127.0.0.1:9/out")))  # nothing listens
    assert not w.log.batches()
    hdfs = w.fixture("hdfs")  # the fix: a NameNode that answers
    out = hdfs.fresh_dir("bad-input-hdfs-unreachable") + "/out"
    try:
        w.run(FileSink(out))
        table = read_output(out)
        assert_exactly_once(table.column("id").to_pylist(), EXPECTED)
    finally:
        hdfs.delete(out.rsplit("/", 1)[0])


def no_checkpoint(w: World, case: Case) -> None:
    from integration.streams import id_stream, run_available
    from sparkeos import exactly_once
    from sparkeos.testing.job import write_input

    spark = w.fixture("spark")
    write_input(str(w.tmp / "in"), ROWS)
    out = w.tmp / "out"

    def run(checkpoint: str | None) -> None:
        run_available(id_stream(spark, str(w.tmp / "in")),
                      exactly_once(FileSink(str(out)), name="cat"), checkpoint)

    with pytest.raises(Exception) as info:
        run(None)
    message = str(info.value)
    assert case.cause in message and case.fix in message.split("What to do:", 1)[1]
    assert _file_ids(out) == []
    run(str(w.tmp / "ckpt"))
    assert_exactly_once(_file_ids(out), EXPECTED)


def lost_checkpoint(w: World, case: Case) -> None:
    out = w.tmp / "out"
    w.run(FileSink(str(out)))
    lost = CommitLog(LocalStore(str(w.tmp / "new-log")))
    fresh = Coordinator(FileSink(str(out)), CoordinatorConfig(name="cat"), lost, "newq")
    expect(case, lambda: fresh.run_batch(0, ListRunner(ROWS)))
    assert_exactly_once(_file_ids(out), EXPECTED)  # nothing written twice
    # The fix: the checkpoint is restored; the query goes on from it.
    w.run(FileSink(str(out)), [[4], [5]], batch_id=1)
    assert_exactly_once(_file_ids(out), [*EXPECTED, 4, 5])


def two_queries_one_checkpoint(w: World, case: Case) -> None:
    sink, config = FileSink(str(w.tmp / "out")), CoordinatorConfig(name="cat")
    ForeachBatchAdapter(sink, config)._claim_log(w.log, "query-A")
    expect(case, lambda: ForeachBatchAdapter(sink, config)._claim_log(w.log, "query-B"))
    own = CommitLog(LocalStore(str(w.tmp / "own-log")))  # the fix: its own checkpoint
    key = ForeachBatchAdapter(sink, config)._claim_log(own, "query-B")
    Coordinator(sink, config, own, key).run_batch(0, ListRunner(ROWS))
    assert_exactly_once(_file_ids(w.tmp / "out"), EXPECTED)


def same_name_twice(w: World, case: Case) -> None:
    claim_sink_name(f"run-{w.tag}", "log-a", "adapter-1", "cat")
    expect(case, lambda: claim_sink_name(f"run-{w.tag}", "log-a", "adapter-2", "cat"))
    claim_sink_name(f"run-{w.tag}", "log-b", "adapter-2", "cat-2")  # its own name: fine


def schema_change(w: World, case: Case) -> None:
    import pyarrow as pa

    out = w.tmp / "out"
    w.run(FileSink(str(out)), [[1], [2]])
    changed = ListRunner([[3]])
    changed.schema = pa.schema([("id", pa.string()), ("payload", pa.string())])
    expect(case, lambda: w.coordinator(FileSink(str(out))).run_batch(1, changed))
    w.run(FileSink(str(out)), [[3]], batch_id=1)  # the query selects the old schema again
    assert_exactly_once(_file_ids(out), EXPECTED)


def refused_first_batch(w: World, case: Case) -> None:
    from sparkeos.testing.inprocess import ArrowRunner, id_batch

    admin, table = w.fixture("admin"), _pg(w)[1].table
    with admin.cursor() as cur:
        cur.execute(f'CREATE TABLE "{table}" (id bigint, payload bigint)')
    text_payload = ArrowRunner([id_batch([1, 2]), id_batch([3])])
    expect(case, lambda: w.coordinator(_pg_sink(w)).run_batch(0, text_payload))
    with admin.cursor() as cur:  # the user fixes the table; the schema was not pinned
        cur.execute(f'ALTER TABLE "{table}" ALTER COLUMN payload TYPE text')
    w.run(_pg_sink(w))
    assert_exactly_once(_pg_ids(w), EXPECTED)


def empty_batches(w: World, case: Case) -> None:
    out = w.tmp / "out"
    assert w.run(FileSink(str(out)), []).outcome == "committed"  # no partitions
    assert w.run(FileSink(str(out)), [[], []], batch_id=1).rows == 0  # empty partitions
    w.run(FileSink(str(out)), ROWS, batch_id=2)
    assert_exactly_once(_file_ids(out), EXPECTED)


def corrupt_log_record(w: World, case: Case) -> None:
    out = w.tmp / "out"
    w.run(FileSink(str(out)))
    path = Path(w.log.location) / record_name(0, OUTCOME, 0)
    good = path.read_bytes()
    path.write_text("{truncated")
    expect(case, lambda: w.run(FileSink(str(out)), [[4]], batch_id=1))
    path.write_bytes(good)  # restored from a backup
    w.run(FileSink(str(out)), [[4]], batch_id=1)
    assert_exactly_once(_file_ids(out), [*EXPECTED, 4])


def cli_not_a_checkpoint(w: World, case: Case) -> None:
    from sparkeos.cli import main

    capsys = w.fixture("capsys")
    assert main(["status", str(w.tmp / "not-a-checkpoint")]) == 2
    err = capsys.readouterr().err
    assert case.cause in err and case.fix in err.split("What to do:", 1)[1]
    assert not (w.tmp / "not-a-checkpoint").exists()


def recover_while_running(w: World, case: Case) -> None:
    import socket
    import time

    from sparkeos.cli import check_lease

    w.log.write_lease({"query_id": "q", "host": socket.gethostname(), "pid": os.getpid(),
                       "renewed": time.time(), "ttl_s": 300})
    expect(case, lambda: check_lease("cat", w.log))
    w.log.write_lease({"host": socket.gethostname(), "pid": os.getpid(),
                       "renewed": time.time() - 600, "ttl_s": 300})  # the query stopped
    check_lease("cat", w.log)


def task_attempts_out_of_range(w: World, case: Case) -> None:
    out = w.tmp / "out"
    runner = ListRunner(ROWS)
    runner.first_attempt = {0: 3}  # Spark's attempt numbers beyond the recorded range
    expect(case, lambda: w.coordinator(FileSink(str(out)), task_attempts=2).run_batch(
        0, runner))
    assert _file_ids(out) == []
    w.coordinator(FileSink(str(out)), task_attempts=8).run_batch(0, runner)
    assert_exactly_once(_file_ids(out), EXPECTED)


SCENARIOS: dict[str, Callable[[World, Case], None]] = {
    case.id: globals()[case.id.replace("-", "_")] for case in CASES
}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    SCENARIOS[case.id](World(tmp_path, request), case)


def troubleshooting_table() -> str:
    lines = ["| symptom | error | what to do |", "| --- | --- | --- |"]
    for case in CASES:
        error = f"`{case.error.__name__}`" if case.error else "none"
        lines.append(f"| {case.mistake} | {error} | {case.remedy} |")
    return "\n".join(lines)


def test_the_docs_table_matches() -> None:
    """docs/operations.md's troubleshooting table is this catalogue (regenerate it with
    ``python -c 'from integration.test_bad_input import troubleshooting_table as t;
    print(t())'``)."""
    text = (REPO / "docs" / "operations.md").read_text()
    assert troubleshooting_table() in text
