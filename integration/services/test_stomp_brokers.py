"""The STOMP broker fixtures give real, working brokers: persistent SENDs confirmed by a
receipt, client-individual ACKs, exact queue depths, and Artemis' duplicate detection."""

from __future__ import annotations

import uuid

import pytest

from integration.stomp_helpers import (
    drain,
    queue_depth_artemis,
    queue_depth_classic,
    queue_depth_rabbitmq,
    send,
    server_of,
)

BODIES = ["m0", "m1", "m2"]


def unique_queue(kind: str) -> str:
    return f"seos-it-{kind}-{uuid.uuid4().hex[:12]}"


def test_artemis_send_ack_drain(artemis_url: str, local_artemis: bool) -> None:
    assert "artemis" in server_of(artemis_url).lower()
    name = unique_queue("artemis")
    send(artemis_url, name, BODIES)
    if local_artemis:
        assert queue_depth_artemis(name, artemis_url) == 3
    got = drain(artemis_url, name, expect=3)
    assert [m.body for m in got] == BODIES
    assert all(m.headers.get("persistent") == "true" for m in got)
    if local_artemis:
        assert queue_depth_artemis(name, artemis_url) == 0
    assert drain(artemis_url, name, idle=0.5) == []


def test_artemis_unacked_messages_stay(artemis_url: str, local_artemis: bool) -> None:
    name = unique_queue("artemis")
    send(artemis_url, name, BODIES)
    assert [m.body for m in drain(artemis_url, name, expect=3, ack=False)] == BODIES
    if local_artemis:
        assert queue_depth_artemis(name, artemis_url) == 3
    assert [m.body for m in drain(artemis_url, name, expect=3)] == BODIES
    if local_artemis:
        assert queue_depth_artemis(name, artemis_url) == 0


def test_artemis_duplicate_id_is_dropped(artemis_url: str, local_artemis: bool) -> None:
    name = unique_queue("artemis")
    send(artemis_url, name, ["a"], headers={"_AMQ_DUPL_ID": f"{name}-1"})
    # the same id again: dropped silently (the RECEIPT still comes), also on a new connection
    send(artemis_url, name, ["a-again"], headers={"_AMQ_DUPL_ID": f"{name}-1"})
    send(artemis_url, name, ["b", "b-again"],
         headers=[{"_AMQ_DUPL_ID": f"{name}-2"}, {"_AMQ_DUPL_ID": f"{name}-2"}])
    if local_artemis:
        assert queue_depth_artemis(name, artemis_url) == 2
        got = drain(artemis_url, name, expect=2)
        assert queue_depth_artemis(name, artemis_url) == 0
    else:
        got = drain(artemis_url, name, idle=1.0)
    assert [m.body for m in got] == ["a", "b"]


def test_artemis_queue_prefix(artemis_url: str, local_artemis: bool) -> None:
    """The local Artemis maps /queue/<name> to the ANYCAST queue <name>, like the others."""
    if not local_artemis:
        pytest.skip("anycastPrefix=/queue/ is a setting of docker/services/artemis.sh")
    name = unique_queue("artemis")
    send(artemis_url, f"/queue/{name}", BODIES)
    assert queue_depth_artemis(name, artemis_url) == 3
    assert [m.body for m in drain(artemis_url, name, expect=3)] == BODIES
    assert queue_depth_artemis(name, artemis_url) == 0


def test_activemq_classic_send_ack_drain(activemq_url: str) -> None:
    assert server_of(activemq_url).startswith("ActiveMQ/")
    destination = f"/queue/{unique_queue('classic')}"
    send(activemq_url, destination, BODIES)
    assert queue_depth_classic(activemq_url, destination) == 3
    got = drain(activemq_url, destination, expect=3)
    assert [m.body for m in got] == BODIES
    assert queue_depth_classic(activemq_url, destination) == 0


def test_rabbitmq_send_ack_drain(rabbitmq_url: str, local_rabbitmq: bool) -> None:
    assert server_of(rabbitmq_url).startswith("RabbitMQ/")
    name = unique_queue("rabbit")
    destination = f"/queue/{name}"
    send(rabbitmq_url, destination, BODIES)
    if local_rabbitmq:
        assert queue_depth_rabbitmq(name) == 3
    got = drain(rabbitmq_url, destination, expect=3)
    assert [m.body for m in got] == BODIES
    if local_rabbitmq:
        assert queue_depth_rabbitmq(name) == 0
    assert drain(rabbitmq_url, destination, idle=0.5) == []
