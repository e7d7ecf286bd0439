"""KafkaSink against a real broker: markers, fencing, aborts, validation, modes."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from sparkeos.connectors.kafka import KafkaSink, markers, read_topic
from sparkeos.connectors.kafka.sink import _Handle
from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import (
    AttemptFencedError,
    ConfigurationError,
    RetriableError,
    SchemaMismatchError,
)
from sparkeos.core.protocol import Transaction, TxnState
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.txpool import TransactionPool
from sparkeos.core.storage.logstores import LocalStore
from sparkeos.testing.inprocess import ID_SCHEMA, ArrowRunner, ListRunner, id_batch

from .conftest import create_topic, unique_name


@pytest.fixture
def topic(kafka_bootstrap: str, tmp_path: Any) -> str:
    name = unique_name(str(tmp_path))
    create_topic(kafka_bootstrap, name, partitions=2)
    return name


def make_sink(bootstrap: str, topic: str, tmp_path: Any, **kwargs: Any) -> KafkaSink:
    settings: dict[str, Any] = {
        "staging_dir": str(tmp_path / "staging"),
        "transactional_id_prefix": unique_name(str(tmp_path), "t") + "-",
        "timeout_s": 20.0,
    }
    settings.update(kwargs)
    return KafkaSink(bootstrap, topic=topic, **settings)


def ids(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[int]:
    return sorted(int(json.loads(m.value())["id"])
                  for m in read_topic(bootstrap, topic, isolation=isolation))


def values(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[bytes]:
    return [m.value() for m in read_topic(bootstrap, topic, isolation=isolation)]


def pool_txn(batch: int, partition: int = 0, tag: int = 0, run: int = 0) -> Transaction:
    return TransactionPool("itq", "kafka-it").transaction(batch, partition, run, tag)


def stage(sink: KafkaSink, txn: Transaction, rows: list[int],
          validate: bool = True) -> dict[str, Any]:
    if validate:
        # What the driver does before phase 1: marks the staging directory, and creates the
        # marker topic compacted (on a fresh broker, a commit would otherwise auto-create it
        # with the default cleanup policy, which the next validate refuses).
        sink.validate(id_batch(rows).schema)
    else:
        sink._check_staging_dir()
    handle = sink.begin(txn)
    sink.write(handle, id_batch(rows))
    return sink.prepare(handle)


# -- what the broker guarantees (the marker design rests on these) ----------------------------
def test_marker_offset_is_visible_only_after_commit(kafka_bootstrap: str, topic: str) -> None:
    marker_topic = topic + "-marker"
    create_topic(kafka_bootstrap, marker_topic, partitions=1)
    group = f"{topic}-group"
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group,
                         "enable.auto.commit": False})

    def committed(timeout: float = 10) -> int:
        return int(consumer.committed([TopicPartition(marker_topic, 0)], timeout=timeout)[0]
                   .offset)

    def transaction(tid: str, offset: int, end: str) -> Producer:
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": tid})
        producer.init_transactions(20)
        producer.begin_transaction()
        producer.produce(topic, b'{"id": 1}')
        producer.send_offsets_to_transaction([TopicPartition(marker_topic, 0, offset)],
                                             consumer.consumer_group_metadata(), 20)
        if end == "commit":
            producer.commit_transaction(20)
        elif end == "abort":
            producer.abort_transaction(20)
        return producer

    assert committed() < 0  # no marker yet
    transaction(f"{topic}-a", 5, "commit")
    assert committed() == 5
    transaction(f"{topic}-a", 6, "abort")
    assert committed() == 5, "an aborted transaction advanced the marker"
    open_txn = transaction(f"{topic}-b", 7, "open")
    with pytest.raises(KafkaException):  # a pending offset is never returned
        committed(timeout=3)
    # A new producer with the same transactional.id aborts the open transaction.
    fresh = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-b"})
    fresh.init_transactions(20)
    assert committed() == 5
    with pytest.raises(KafkaException):
        open_txn.commit_transaction(10)
    consumer.close()


def test_zombie_producer_is_fenced(kafka_bootstrap: str, topic: str) -> None:
    tid = f"{topic}-zombie"
    zombie = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": tid})
    zombie.init_transactions(20)
    zombie.begin_transaction()
    zombie.produce(topic, b'{"id": 666}')
    zombie.flush(10)
    successor = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": tid})
    successor.init_transactions(20)  # fences the zombie, aborts its transaction
    successor.begin_transaction()
    successor.produce(topic, b'{"id": 1}')
    successor.commit_transaction(20)
    with pytest.raises(KafkaException) as caught:
        zombie.produce(topic, b'{"id": 667}')
        zombie.commit_transaction(10)
    assert caught.value.args[0].fatal() or caught.value.args[0].txn_requires_abort()
    assert ids(kafka_bootstrap, topic) == [1]
    assert 666 in ids(kafka_bootstrap, topic, "read_uncommitted")


def test_zombie_task_attempt_is_fenced_by_the_next_attempt(
        kafka_bootstrap: str, topic: str, tmp_path: Any) -> None:
    """Direct mode: an attempt still producing after its retry began never commits, and
    says it was fenced, whichever call notices first (librdkafka may report the fence as
    `_FATAL` from produce, or as a fenced commit)."""
    sink = make_sink(kafka_bootstrap, topic, tmp_path, mode="direct")
    sink.validate(ID_SCHEMA)  # as the driver does: creates the marker topic compacted
    zombie = sink.begin(pool_txn(0, 0, tag=0))
    sink.write(zombie, id_batch([100, 101]))
    retry = sink.begin(pool_txn(0, 0, tag=1))
    sink.write(retry, id_batch([1, 2]))
    with pytest.raises(AttemptFencedError, match="fenced by a newer attempt"):
        sink.write(zombie, id_batch([102]))
        sink.prepare(zombie)  # if producing did not notice the fence, committing does
    sink.prepare(retry)
    assert ids(kafka_bootstrap, topic) == [1, 2]


def test_aborted_transactions_are_invisible_to_read_committed(
        kafka_bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": kafka_bootstrap,
                         "transactional.id": f"{topic}-abort"})
    producer.init_transactions(20)
    for number, end in ((1, "commit"), (2, "abort"), (3, "commit"), (4, "abort")):
        producer.begin_transaction()
        producer.produce(topic, json.dumps({"id": number}).encode())
        if end == "commit":
            producer.commit_transaction(20)
        else:
            producer.flush(10)
            producer.abort_transaction(20)
    assert ids(kafka_bootstrap, topic) == [1, 3]
    assert ids(kafka_bootstrap, topic, "read_uncommitted") == [1, 2, 3, 4]


# -- the sink's marker ----------------------------------------------------------------------
def test_marker_check_skips_an_already_committed_participant(
        kafka_bootstrap: str, topic: str, tmp_path: Any) -> None:
    sink = make_sink(kafka_bootstrap, topic, tmp_path)
    sink.validate(ID_SCHEMA)
    txn = pool_txn(4, 1, tag=0)
    receipt = stage(sink, txn, [1, 2, 3])
    assert sink.probe(txn) is TxnState.PREPARED
    sink.commit(txn, receipt)
    assert ids(kafka_bootstrap, topic) == [1, 2, 3]
    assert sink.probe(txn) is TxnState.COMMITTED
    assert [n for n in os.listdir(sink.staging_dir or "") if not n.startswith(".")] == []

    # Commit again from the same receipt (a retried commit task): nothing new.
    sink.commit(txn, receipt)
    # A second attempt of the same (batch, partition) with the same rows (a replay
    # partitioned as before): the marker names them, so it is skipped.
    again = pool_txn(4, 1, tag=1)
    sink.commit(again, stage(sink, again, [1, 2, 3]))
    assert ids(kafka_bootstrap, topic) == [1, 2, 3]
    # One with other rows (an at-least-once replay partitioned otherwise) is published:
    # a marker of other rows never hides rows it does not hold (core.snapshot.replay).
    other_rows = pool_txn(4, 1, tag=2)
    sink.commit(other_rows, stage(sink, other_rows, [3, 99]))
    assert ids(kafka_bootstrap, topic) == [1, 2, 3, 3, 99]
    # Another participant of the same batch has its own marker.
    other = pool_txn(4, 0)
    assert sink.probe(other) is TxnState.ABSENT
    sink.commit(other, stage(sink, other, [7]))
    # The next batch on the same transactional ID (slot) is not skipped.
    later = pool_txn(6, 1)
    sink.commit(later, stage(sink, later, [8]))
    assert ids(kafka_bootstrap, topic) == [1, 2, 3, 3, 7, 8, 99]


def test_broken_marker_check_would_duplicate(
        kafka_bootstrap: str, topic: str, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The marker is what makes commit idempotent: without it a retried commit duplicates."""
    sink = make_sink(kafka_bootstrap, topic, tmp_path)
    sink.validate(ID_SCHEMA)
    txn = pool_txn(0, 0)
    receipt = stage(sink, txn, [1, 2])
    staged = os.path.join(sink.staging_dir or "", receipt["file"])
    with open(staged, "rb") as fh:
        backup = fh.read()
    sink.commit(txn, receipt)
    os.makedirs(os.path.dirname(staged), exist_ok=True)
    with open(staged, "wb") as fh:  # the staged file as before the first commit
        fh.write(backup)
    monkeypatch.setattr(markers, "committed_marker",
                        lambda config, txn, *args, **kwargs: markers.NO_MARKER)
    sink.commit(txn, receipt)
    assert ids(kafka_bootstrap, topic) == [1, 1, 2, 2]


def test_rollback_deletes_one_attempt_and_commit_aborts_what_a_crash_left_open(
        kafka_bootstrap: str, topic: str, tmp_path: Any) -> None:
    direct = make_sink(kafka_bootstrap, topic, tmp_path, mode="direct")
    handle = direct.begin(pool_txn(2, 0, tag=0))
    direct.write(handle, id_batch([5, 6]))
    handle.producer.flush(10)  # the records are on the broker, the transaction open
    staged_sink = make_sink(kafka_bootstrap, topic, tmp_path,
                            transactional_id_prefix=direct.transactional_id_prefix)
    doomed, decided = pool_txn(2, 0, tag=1), pool_txn(2, 0, tag=2)
    stage(staged_sink, doomed, [9])
    receipt = stage(staged_sink, decided, [10])
    assert staged_sink.probe(doomed) is TxnState.PREPARED
    staged_sink.rollback(doomed)  # only this attempt's staged file
    staged_sink.rollback(doomed)
    staged_sink.rollback(pool_txn(40, 3))  # never used: fine
    assert staged_sink.probe(doomed) is TxnState.ABSENT
    assert staged_sink.probe(decided) is TxnState.PREPARED
    # Same participant (transactional.id): init_transactions aborts the open transaction.
    staged_sink.commit(decided, receipt)
    assert ids(kafka_bootstrap, topic) == [10]
    assert ids(kafka_bootstrap, topic, "read_uncommitted") == [5, 6, 10]


def test_commit_of_a_lost_staged_file_is_data_loss(
        kafka_bootstrap: str, topic: str, tmp_path: Any) -> None:
    from sparkeos.core.errors import DataLossError

    sink = make_sink(kafka_bootstrap, topic, tmp_path)
    sink.validate(ID_SCHEMA)
    txn = pool_txn(0, 0)
    receipt = stage(sink, txn, [1])
    os.unlink(os.path.join(sink.staging_dir or "", receipt["file"]))
    with pytest.raises(DataLossError, match="gone"):
        sink.commit(txn, receipt)
    with pytest.raises(RetriableError, match="shared mount"):
        sink.commit(txn, {**receipt, "host": "another-host"})


# -- validation ---------------------------------------------------------------------------------
def test_transaction_timeout_above_the_broker_maximum_is_a_configuration_error(
        kafka_bootstrap: str, topic: str, tmp_path: Any) -> None:
    sink = make_sink(kafka_bootstrap, topic, tmp_path, transaction_timeout_ms=3_600_000)
    with pytest.raises(ConfigurationError, match=r"transaction\.max\.timeout\.ms") as caught:
        sink.validate(ID_SCHEMA)
    assert "transaction_timeout_ms" in str(caught.value)
    # Without the up-front check (e.g. no DescribeConfigs ACL), init_transactions says the
    # same, translated.
    txn = pool_txn(0)
    receipt = stage(sink, txn, [1], validate=False)
    with pytest.raises(ConfigurationError, match=r"transaction\.max\.timeout\.ms"):
        sink.commit(txn, receipt)


def test_unreachable_broker_is_retriable_and_names_no_secret(tmp_path: Any) -> None:
    sink = KafkaSink("127.0.0.1:1", topic="t", staging_dir=str(tmp_path), timeout_s=2,
                     producer_config={"security.protocol": "SASL_PLAINTEXT",
                                      "sasl.mechanism": "PLAIN", "sasl.username": "svc",
                                      "sasl.password": "hunter2-secret"})
    started = time.monotonic()
    with pytest.raises(RetriableError, match=r"127\.0\.0\.1:1") as caught:
        sink.validate(ID_SCHEMA)
    assert time.monotonic() - started < 15
    assert "hunter2" not in str(caught.value)
    assert "hunter2" not in json.dumps(sink.describe())
    assert sink.describe()["producer_config_omitted"] == ["sasl.password"]


def test_schema_and_configuration_checks(tmp_path: Any) -> None:
    sink = KafkaSink("h:1", topic="t", value_column="body", staging_dir=str(tmp_path))
    with pytest.raises(SchemaMismatchError, match="body"):
        sink.validate(ID_SCHEMA)
    by_column = KafkaSink("h:1", topic_column="id", staging_dir=str(tmp_path))
    with pytest.raises(SchemaMismatchError, match="string"):
        by_column.validate(ID_SCHEMA)
    with pytest.raises(ConfigurationError, match="topic"):
        KafkaSink("h:1")
    with pytest.raises(ConfigurationError, match=r"transactional\.id"):
        KafkaSink("h:1", topic="t", producer_config={"transactional.id": "x"})
    with pytest.raises(ConfigurationError, match="mode"):
        KafkaSink("h:1", topic="t", mode="fast")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o500)
    if os.geteuid() != 0:
        with pytest.raises(ConfigurationError, match="not writable"):
            KafkaSink("h:1", topic="t", staging_dir=str(readonly / "x")).validate(ID_SCHEMA)


# -- modes and record layout ------------------------------------------------------------------
def test_direct_mode_is_not_offered_as_exactly_once(tmp_path: Any) -> None:
    sink = KafkaSink("h:1", topic="t", mode="direct")
    assert Guarantee.EXACTLY_ONCE not in sink.guarantees
    log = CommitLog(LocalStore(str(tmp_path / "log")))
    with pytest.raises(ConfigurationError, match="exactly_once"):
        Coordinator(sink, CoordinatorConfig(name="d"), log, "q")


def test_direct_mode_replay_skips_committed_partitions(
        kafka_bootstrap: str, topic: str, tmp_path: Any) -> None:
    sink = make_sink(kafka_bootstrap, topic, tmp_path, mode="direct")
    config = CoordinatorConfig(name="direct", guarantee=Guarantee.AT_LEAST_ONCE)
    coordinator = Coordinator(sink, config, None, "directq")
    coordinator.run_batch(0, ListRunner([[1, 2], [3]]))
    coordinator.run_batch(0, ListRunner([[1, 2], [3]]))  # Spark re-runs batch 0
    coordinator.run_batch(1, ListRunner([[4], [5]]))
    assert ids(kafka_bootstrap, topic) == [1, 2, 3, 4, 5]


def test_record_layout_keys_headers_and_topic_column(
        kafka_bootstrap: str, topic: str, tmp_path: Any) -> None:
    second = topic + "-b"
    create_topic(kafka_bootstrap, second, partitions=1)
    schema = pa.schema([("dest", pa.string()), ("k", pa.int64()), ("v", pa.string()),
                        ("h", pa.list_(pa.struct([("key", pa.string()),
                                                  ("value", pa.binary())])))])
    batch = pa.RecordBatch.from_pylist([
        {"dest": None, "k": 1, "v": "one", "h": [{"key": "trace", "value": b"x1"}]},
        {"dest": second, "k": 2, "v": "two", "h": None},
    ], schema=schema)
    sink = make_sink(kafka_bootstrap, topic, tmp_path, topic_column="dest", key_column="k",
                     key_format="string", value_column="v", headers_column="h")
    sink.validate(schema)
    txn = pool_txn(0)
    handle: _Handle = sink.begin(txn)
    sink.write(handle, batch)
    sink.commit(txn, sink.prepare(handle))
    first = read_topic(kafka_bootstrap, topic)
    assert [(m.key(), m.value(), m.headers()) for m in first] == [
        (b"1", b"one", [("trace", b"x1")])]
    assert [(m.key(), m.value()) for m in read_topic(kafka_bootstrap, second)] == [
        (b"2", b"two")]


def test_whole_row_json_is_the_default_value() -> None:
    sink = KafkaSink("h:1", topic="t", mode="direct")
    records = sink.layout().serialize(id_batch([7, 8]))
    assert records.column("value").to_pylist() == [b'{"id":7,"payload":"row-7"}',
                                                  b'{"id":8,"payload":"row-8"}']
    assert records.column("key").null_count == 2


def test_spark_kafka_jars_and_source_arguments(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Any) -> None:
    from sparkeos.connectors.kafka import kafka_source, spark_kafka_jars

    jar = tmp_path / "a.jar"
    jar.write_bytes(b"")
    monkeypatch.setenv("SPARKEOS_SPARK_JARS", f"{jar}")
    assert spark_kafka_jars() == [str(jar)]
    monkeypatch.setenv("SPARKEOS_SPARK_JARS", f"{jar},{tmp_path / 'missing.jar'}")
    with pytest.raises(ConfigurationError, match=r"missing\.jar"):
        spark_kafka_jars()
    with pytest.raises(ConfigurationError, match="exactly one"):
        kafka_source(object(), "h:1")
    with pytest.raises(ConfigurationError, match="isolation_level"):
        kafka_source(object(), "h:1", "t", isolation_level="dirty")


@pytest.mark.chaos
def test_broker_restart_between_decision_and_commit(
        private_kafka: Any, tmp_path: Any) -> None:
    """The broker is down when a decided batch must be committed: a retriable error,
    nothing lost; once it is back, the restart commits the batch exactly once. A broker
    of the test's own: other tests use the session's at the same time."""
    from sparkeos.core.faults import FaultPlan, InjectedCrash

    kafka_broker = private_kafka
    kafka_bootstrap = kafka_broker.bootstrap
    topic = unique_name(str(tmp_path))
    create_topic(kafka_bootstrap, topic, partitions=2)
    sink = make_sink(kafka_bootstrap, topic, tmp_path, timeout_s=5.0)
    log = CommitLog(LocalStore(str(tmp_path / "log")))
    config = CoordinatorConfig(name="kafka-it")
    with pytest.raises(InjectedCrash):
        Coordinator(sink, config, log, "itq", FaultPlan("after_decided", 0, simulate=True)
                    ).run_batch(0, ListRunner([[1, 2], [3]]))
    kafka_broker.stop()
    try:
        with pytest.raises(RetriableError, match="batch=0"):
            Coordinator(sink, config, log, "itq").run_batch(0, ListRunner([[1, 2], [3]]))
    finally:
        kafka_broker.start()
    metrics = Coordinator(sink, config, log, "itq").run_batch(0, ListRunner([[1, 2], [3]]))
    assert metrics.outcome == "replayed"
    assert ids(kafka_bootstrap, topic) == [1, 2, 3]


def test_repr_never_shows_producer_secrets(tmp_path: Any) -> None:
    sink = KafkaSink("h:1", topic="t", staging_dir=str(tmp_path),
                     producer_config={"sasl.password": "hunter2-canary",
                                      "ssl.key.password": "canary-2"})
    assert "canary" not in repr(sink) and "canary" not in str(sink.describe())


def test_a_fatal_error_is_classified_by_the_error_behind_it() -> None:
    """Issue 8, defect 5: librdkafka reports a fence as `_FATAL: Local: Fatal error`
    from whichever call hits it; the user must read that the attempt was fenced."""
    from confluent_kafka import KafkaError

    from sparkeos.connectors.kafka.errors import PHASE1, translate, underlying

    class FencedProducer:
        def poll(self, timeout: float) -> int:
            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced by newer instance",
                                            fatal=True))

    fatal = KafkaException(KafkaError(KafkaError._FATAL, "Local: Fatal error", fatal=True))
    error = translate(underlying(FencedProducer(), fatal), sink="k", txn=pool_txn(0),
                      phase=PHASE1, bootstrap="b:1", action="produce")
    assert isinstance(error, AttemptFencedError)
    assert "fenced by a newer attempt" in str(error) and "_FATAL" not in str(error)


def test_a_failed_broker_check_leaves_no_client_behind(
        tmp_path: Any, capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 15, defect 7: the client of a failed check kept reconnecting (and logging
    every second) for the rest of the driver's life while the error was referenced."""
    sink = KafkaSink("127.0.0.1:1", topic="t", staging_dir=str(tmp_path), timeout_s=2)
    with pytest.raises(RetriableError) as caught:
        sink.validate(ID_SCHEMA)
    capfd.readouterr()
    time.sleep(3)  # the error is still referenced (caught); nothing may log meanwhile
    assert "Connect to" not in capfd.readouterr().err, caught.value


def test_a_missing_topic_is_refused_before_the_decision(strict_kafka: str,
                                                         tmp_path: Any) -> None:
    """Issue 15, defect 3: with automatic topic creation off, a missing topic was found
    only when the decided batch's commit timed out. Fixed topics are checked in
    validate, per-row topics before the attempt prepares; both name the topic."""
    missing = unique_name(str(tmp_path), "missing")
    fixed = make_sink(strict_kafka, missing, tmp_path)
    with pytest.raises(ConfigurationError, match=f"topic '{missing}' does not exist"):
        fixed.validate(ID_SCHEMA)

    present = unique_name(str(tmp_path), "present")
    create_topic(strict_kafka, present, partitions=1)
    per_row = make_sink(strict_kafka, present, tmp_path, topic_column="dest")
    schema = pa.schema([("id", pa.int64()), ("dest", pa.string())])
    runner = ArrowRunner([pa.RecordBatch.from_pydict(
        {"id": [1, 2], "dest": [present, missing]}, schema=schema)], schema=schema)
    log = CommitLog(LocalStore(str(tmp_path / "log")))
    coordinator = Coordinator(per_row, CoordinatorConfig(name="topics"), log, "tq")
    with pytest.raises(ConfigurationError, match=f"topic '{missing}' does not exist"):
        coordinator.run_batch(0, runner)
    assert log.batches()[0].decided is None  # refused before the decision
    create_topic(strict_kafka, missing, partitions=1)
    Coordinator(per_row, CoordinatorConfig(name="topics"), log, "tq").run_batch(0, runner)
    assert [json.loads(m.value())["id"] for m in read_topic(strict_kafka, missing)] == [2]


def test_the_lost_checkpoint_guard_cannot_decide_past_an_open_transaction(
        kafka_bootstrap: str, topic: str, tmp_path: Any) -> None:
    """Another producer's transaction open on the (shared) marker topic hides every
    progress record after it from a read_committed reader: the guard cannot tell whether
    another query wrote this sink, so it stops the batch (it answered "no other output"
    before, and the batch was written again). Once the transaction ends it decides."""
    markers = unique_name(str(tmp_path), "m")
    create_topic(kafka_bootstrap, markers, partitions=1, config={"cleanup.policy": "compact"})
    sink = make_sink(kafka_bootstrap, topic, tmp_path, marker_topic=markers, timeout_s=3.0)
    other = Producer({"bootstrap.servers": kafka_bootstrap,
                      "transactional.id": unique_name(str(tmp_path), "open")})
    other.init_transactions(20)
    other.begin_transaction()
    other.produce(markers, b'{"batch": 0}', b"another-query")
    other.flush(20)
    with pytest.raises(RetriableError, match="could not read the progress records"):
        sink.output_of_other_queries("q1", "orders")
    other.abort_transaction(20)
    # Now the read must answer: with the default timeout, not the short one that made the
    # held read above give up soon (a loaded machine may take longer than that to answer).
    decided = make_sink(kafka_bootstrap, topic, tmp_path, marker_topic=markers)
    assert decided.output_of_other_queries("q1", "orders") is None
