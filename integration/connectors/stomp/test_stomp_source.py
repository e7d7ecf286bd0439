"""The acknowledging STOMP source end to end: STOMP -> Spark -> file / STOMP.

Every test publishes numbered JSON messages, runs the streaming job (a child process,
``availableNow``) until the queue is drained, and checks every id exactly once in the
output, the input queue empty (broker counters, acknowledged messages only) and no
spool left. Chaos tests kill the whole job at sink and source protocol points first.
A run that reads nothing ends the loop only when the broker says the queue is empty,
so no check depends on timing.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from integration.stomp_helpers import (
    drain,
    queue_depth_artemis,
    queue_depth_classic,
    queue_depth_rabbitmq,
    send,
)
from sparkeos.testing.conformance import assert_exactly_once

from .stomp_job import StompJobSpec, run_stomp_job

MESSAGES = 200


class Broker:
    """A broker whose queues the test can count (``depth``): the jobs run until the input
    queue is empty. ActiveMQ Classic is counted over STOMP (a queue browser), Artemis and
    RabbitMQ with their CLI, which a broker you run (named by a variable) does not offer."""

    def __init__(self, kind: str, url: str, local: bool) -> None:
        if kind != "activemq" and not local:
            pytest.skip(f"counts {kind} queues with its CLI: needs a container or the local "
                        "broker, not one named by a variable")
        self.kind, self.url = kind, url

    def queue(self, name: str) -> str:
        return name if self.kind == "artemis" else f"/queue/{name}"

    def depth(self, queue: str) -> int:
        try:
            if self.kind == "artemis":
                return queue_depth_artemis(queue, self.url)
            if self.kind == "rabbitmq":
                return queue_depth_rabbitmq(queue.removeprefix("/queue/"))
        except LookupError:
            return 0
        return queue_depth_classic(self.url, queue)


@pytest.fixture(params=["artemis", "activemq"])
def broker(request: Any) -> Broker:
    if request.param == "artemis":
        return Broker("artemis", request.getfixturevalue("artemis_url"),
                      request.getfixturevalue("local_artemis"))
    return Broker("activemq", request.getfixturevalue("activemq_url"), True)


def publish(broker: Broker, queue: str, ids: list[int]) -> None:
    """Numbered JSON messages; each carries a producer-set ID in ``sparkeos-dedup-id``
    (what RabbitMQ needs: it changes ``message-id`` on every delivery)."""
    send(broker.url, queue, [json.dumps({"id": i}) for i in ids],
         [{"sparkeos-dedup-id": f"{queue}-{i}"} for i in ids])


def make_spec(broker: Broker, tmp: str, sink: str = "file", **extra: Any) -> StompJobSpec:
    name = f"seos-in-{uuid.uuid4().hex[:10]}"
    output = {"file": os.path.join(tmp, "out"),
              "stomp": f"seos-out-{uuid.uuid4().hex[:10]}"}[sink]
    return StompJobSpec(url=broker.url, input_queue=broker.queue(name),
                        checkpoint=os.path.join(tmp, "checkpoint"),
                        spool_dir=os.path.join(tmp, "spool"), output=output, sink=sink,
                        **extra)


def run_until_crash(spec: StompJobSpec, fault: str | None = None,
                    source_fault: str | None = None, tries: int = 4) -> None:
    """Run with a kill planned until it happened: a run whose first pull found nothing
    yet (a busy broker) ends normally before reaching the point, and is run again."""
    for _ in range(tries):
        result = run_stomp_job(spec, fault=fault, source_fault=source_fault)
        if result.crashed:
            return
        assert result.returncode == 0, f"the job failed:\n{result.tail()}"
    raise AssertionError(f"{fault or source_fault} never killed the job:\n{result.tail()}")


def file_ids(spec: StompJobSpec) -> list[int]:
    import pyarrow.dataset as ds

    if not os.path.isdir(spec.output):
        return []
    files = [os.path.join(spec.output, n) for n in os.listdir(spec.output)
             if n.endswith(".parquet")]
    return ds.dataset(files).to_table().column("id").to_pylist() if files else []


def drain_job(spec: StompJobSpec, broker: Broker, runs: int = 12) -> None:
    """Run the job until it succeeds with the queue empty: an availableNow run ends at
    its first empty pull, and the messages of its last batch are acknowledged by the
    next run (the job starts its query again until a run reads nothing)."""
    # A drain's runs end at a pull that waits poll_timeout_s for nothing: a shorter wait
    # here. A pull that gave up early only costs another run of this loop.
    for _ in range(runs):
        result = run_stomp_job(dataclasses.replace(spec, drain=True, poll_timeout_s=1.0))
        assert result.returncode == 0, f"the job failed:\n{result.tail()}"
        if broker.depth(spec.input_queue) == 0:
            return
    raise AssertionError(f"{spec.input_queue} not drained after {runs} runs "
                         f"(depth {broker.depth(spec.input_queue)})")


def assert_spool_empty(spec: StompJobSpec) -> None:
    pulls = os.path.join(spec.spool_dir, "pulls")
    left = sorted(os.listdir(pulls)) if os.path.isdir(pulls) else []
    assert left == [], f"spool files left: {left}"


def test_stomp_to_file_on_rabbitmq_with_a_producer_set_id(
        rabbitmq_url: str, local_rabbitmq: bool, tmp_path: Any) -> None:
    """RabbitMQ changes message-id on every delivery: the producer's header is the ID.
    Killed before the first ACK, the redelivered batch is still recognised."""
    broker = Broker("rabbitmq", rabbitmq_url, local_rabbitmq)
    spec = make_spec(broker, str(tmp_path), message_id_header="sparkeos-dedup-id")
    publish(broker, spec.input_queue, list(range(60)))
    run_until_crash(spec, source_fault="source_before_ack@1")
    drain_job(spec, broker)
    assert_exactly_once(file_ids(spec), list(range(60)))
    assert_spool_empty(spec)


def test_stomp_to_file_exactly_once(artemis_url: str, local_artemis: bool,
                                    tmp_path: Any) -> None:
    """Every message once, then more published and read by a later run. On Artemis; on
    ActiveMQ Classic, test_redelivery_after_commit_before_ack_is_dropped drains a queue
    to exactly once too, through a kill."""
    broker = Broker("artemis", artemis_url, local_artemis)
    spec = make_spec(broker, str(tmp_path))
    publish(broker, spec.input_queue, list(range(MESSAGES)))
    drain_job(spec, broker)
    assert_exactly_once(file_ids(spec), list(range(MESSAGES)))
    assert_spool_empty(spec)
    publish(broker, spec.input_queue, list(range(MESSAGES, MESSAGES + 30)))
    drain_job(spec, broker)
    assert_exactly_once(file_ids(spec), list(range(MESSAGES + 30)))


SOURCE_KILLS = ("source_after_spool@2", "source_before_ack@1", "source_after_ack@1")
SINK_KILLS = ("after_decided", "kill_driver_after_first_prepare")
"""The sink's points at whatever batch a run reaches first: the runs before have taken
the queue's first batches, so a point named with a fixed batch could never fire."""


@pytest.mark.chaos
def test_stomp_to_file_survives_kills_at_every_point(artemis_url: str, local_artemis: bool,
                                                     tmp_path: Any) -> None:
    """The job killed at each source point and at a sink point before and after the
    decision (every kill must happen; the sink's other points are the sink's, proven by
    its own suite), then run to the end: every message once, the queue drained, no
    spool left.
    On Artemis; on ActiveMQ Classic the kill between the commit and the acknowledgement
    (``test_redelivery_after_commit_before_ack_is_dropped``) is what differs."""
    broker = Broker("artemis", artemis_url, local_artemis)
    # Batches of 20: ten of them, more than the five kills take.
    spec = make_spec(broker, str(tmp_path), max_batch_messages=20)
    publish(broker, spec.input_queue, list(range(MESSAGES)))
    for kill in SOURCE_KILLS + SINK_KILLS:
        if kill.startswith("source_"):
            run_until_crash(spec, source_fault=kill)
        else:
            run_until_crash(spec, fault=kill)
    drain_job(spec, broker)
    assert_exactly_once(file_ids(spec), list(range(MESSAGES)))
    assert_spool_empty(spec)


def test_stomp_to_stomp_exactly_once(artemis_url: str, local_artemis: bool,
                                     tmp_path: Any) -> None:
    """STOMP -> Spark -> STOMP on Artemis, with a kill after the decision."""
    broker = Broker("artemis", artemis_url, local_artemis)
    spec = make_spec(broker, str(tmp_path), sink="stomp")
    publish(broker, spec.input_queue, list(range(MESSAGES)))
    run_until_crash(spec, fault="after_first_commit@1")
    drain_job(spec, broker)
    depth = broker.depth(spec.output)
    out = drain(broker.url, spec.output, expect=depth, timeout=120.0)
    assert_exactly_once([int(json.loads(json.loads(m.body)["payload"])["id"])
                         for m in out], list(range(MESSAGES)))


@pytest.mark.parametrize("broker", ["activemq"], indirect=True)
def test_redelivery_after_commit_before_ack_is_dropped(broker: Broker, tmp_path: Any) -> None:
    """Killed after the batch was committed, before its ACK: the broker redelivers
    those messages to the next run, which recognises them by ID and acknowledges them
    without a second copy in the output. On ActiveMQ Classic: on Artemis this kill is
    one of test_stomp_to_file_survives_kills_at_every_point's."""
    spec = make_spec(broker, str(tmp_path))
    publish(broker, spec.input_queue, list(range(60)))
    run_until_crash(spec, source_fault="source_before_ack@1")
    assert broker.depth(spec.input_queue) == 60  # nothing was acknowledged
    committed = file_ids(spec)
    assert committed, "the first batch should have been committed before the kill"
    drain_job(spec, broker)
    assert_exactly_once(file_ids(spec), list(range(60)))


@pytest.mark.chaos
def test_broker_restart_mid_batch(tmp_path: Any) -> None:
    """The broker restarts while a spooled batch waits for its ack: the new
    connection's redeliveries are recognised, nothing is lost or doubled."""
    from integration.fixtures.stomp import private_artemis

    with private_artemis("restart") as (url, restart):
        broker = Broker("artemis", url, True)
        spec = make_spec(broker, str(tmp_path))
        publish(broker, spec.input_queue, list(range(MESSAGES)))
        barrier = os.path.join(str(tmp_path), "barrier")
        env = {"SPARKEOS_FAULT_DIR": barrier}

        def when_paused() -> None:
            wait_for(os.path.join(barrier, "paused"))
            restart()
            with open(os.path.join(barrier, "resume"), "w") as fh:
                fh.write("go\n")

        result = run_with(lambda: run_stomp_job(spec, source_fault="source_pause_after_spool@2",
                                                env=env), when_paused)
        assert result.returncode == 0, result.tail()
        drain_job(spec, broker)
        assert_exactly_once(file_ids(spec), list(range(MESSAGES)))
        assert_spool_empty(spec)


def wait_for(path: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def run_with(job: Callable[[], Any], beside: Callable[[], None]) -> Any:
    import threading

    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            beside()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=guarded)
    thread.start()
    result = job()
    thread.join()
    if errors:
        raise errors[0]
    return result


def test_poison_message_fails_loudly_then_goes_to_the_dead_letter_queue(
        artemis_url: str, local_artemis: bool, tmp_path: Any) -> None:
    broker = Broker("artemis", artemis_url, local_artemis)
    spec = make_spec(broker, str(tmp_path))
    send(broker.url, spec.input_queue,
         [json.dumps({"id": 0}), "{not json", json.dumps({"id": 2})])
    result = run_stomp_job(spec)
    assert result.returncode != 0
    assert "BadMessageError" in result.tail(200) and "not JSON" in result.tail(200)
    assert "dead-letter" in result.tail(200)
    assert broker.depth(spec.input_queue) == 3  # nothing acknowledged, nothing lost
    spec.on_bad_message = "dead-letter"
    spec.dead_letter_destination = f"{spec.input_queue}.dlq"
    drain_job(spec, broker)
    assert_exactly_once(file_ids(spec), [0, 2])
    dead = drain(broker.url, spec.dead_letter_destination, expect=1, timeout=60.0)
    assert [m.body for m in dead] == ["{not json"]
    assert dead[0].headers["sparkeos-original-destination"] == spec.input_queue


@pytest.mark.chaos
def test_plain_stomp_consumer_duplicates_under_the_same_kills(
        artemis_url: str, local_artemis: bool, tmp_path: Any) -> None:
    """What sparkeos prevents: a plain stomp.py consumer in foreachBatch that writes,
    then acknowledges, writes a batch twice when it dies in between."""
    broker = Broker("artemis", artemis_url, local_artemis)
    spec = make_spec(broker, str(tmp_path), mode="plain")
    publish(broker, spec.input_queue, list(range(MESSAGES)))
    run_until_crash(spec, fault="after_finished@1")  # one kill duplicates a batch
    drain_job(spec, broker)
    seen = file_ids(spec)
    assert set(seen) == set(range(MESSAGES))
    assert len(seen) > MESSAGES, "the plain consumer was unexpectedly exactly-once"
