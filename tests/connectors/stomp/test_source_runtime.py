"""The acknowledging source's bookkeeping against an in-memory broker.

The fake keeps what matters of a real queue: a message stays until it is
acknowledged on the connection that received it; a new connection gets every
unacknowledged message again (same stable ``message-id``, new ack handle). The real
brokers run the same paths in integration/connectors/stomp/test_stomp_source.py.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import pytest

from sparkeos.connectors.stomp import connection as connection_module
from sparkeos.connectors.stomp.client import ConnectionLost
from sparkeos.connectors.stomp.runtime import Runtime as _Runtime
from sparkeos.connectors.stomp.source import StompSourceConfig
from sparkeos.connectors.stomp.spool import read_pulls
from sparkeos.core.errors import BadMessageError, ConfigurationError


class Frame:
    def __init__(self, headers: dict[str, str], body: bytes) -> None:
        self.headers, self.body = headers, body


class FakeBroker:
    def __init__(self) -> None:
        self.queue: dict[str, bytes] = {}  # message-id -> body, until acknowledged
        self.acked: list[str] = []
        self.sent: dict[str, list[bytes]] = {}
        self.connection: FakeClient | None = None

    def publish(self, *ids: int, body: bytes | None = None) -> None:
        for i in ids:
            self.queue[f"ID:{i}"] = body if body is not None else b'{"id": %d}' % i

    def client(self, *_args: Any, **_kwargs: Any) -> FakeClient:
        return FakeClient(self)


class FakeClient:
    handles = itertools.count()

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.connected = False
        self.kind = "activemq"
        self.inflight: dict[str, str] = {}  # handle -> message-id
        self.delivered: set[str] = set()

    def connect(self) -> FakeClient:
        self.connected = True
        self.broker.connection = self
        return self

    def close(self) -> None:
        self.connected = False

    def subscribe(self, *_args: Any, **_kwargs: Any) -> None:
        pass

    def receive(self, _timeout: float) -> Frame | None:
        if not self.connected:
            raise ConnectionLost("gone")
        for mid, body in self.broker.queue.items():
            if mid not in self.delivered:
                self.delivered.add(mid)
                handle = f"h{next(self.handles)}"
                self.inflight[handle] = mid
                return Frame({"message-id": mid, "ack": handle, "destination": "/queue/q"},
                             body)
        return None

    def new_receipt(self) -> str:
        return "r"

    def ack(self, handle: str, receipt: str | None = None) -> None:
        mid = self.inflight.pop(handle)
        self.broker.queue.pop(mid, None)
        self.broker.acked.append(mid)

    def wait_receipt(self, *_args: Any) -> None:
        pass

    def send(self, destination: str, body: bytes, headers: Any, receipt: str | None = None
             ) -> None:
        self.broker.sent.setdefault(destination, []).append(body)


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> FakeBroker:
    fake = FakeBroker()
    monkeypatch.setattr(connection_module, "StompClient", fake.client)
    return fake


def config(tmp_path: Any, **extra: Any) -> StompSourceConfig:
    return StompSourceConfig("stomp://u:p@localhost:1", "/queue/q",
                             spool_dir=os.path.join(str(tmp_path), "spool"),
                             poll_timeout_s=0.01, idle_timeout_s=0.01, fsync=False, **extra)


def spooled_ids(runtime: _Runtime, low: int, high: int) -> list[int]:
    files = [p.path for p in runtime.spool.pulls()]
    return sorted(int(m.split(":")[1]) for batch in read_pulls(files, low, high)
                  for m in batch.column("message_id").to_pylist())


def run(runtime: _Runtime, start: int, most: int = 100) -> int:
    runtime.settle(start, at_start=True)
    return runtime.pull(start, most)


def test_acknowledges_only_what_spark_committed(broker: FakeBroker, tmp_path: Any) -> None:
    broker.publish(1, 2, 3)
    runtime = _Runtime(config(tmp_path))
    end = run(runtime, 0)
    assert end == 3 and broker.acked == []  # spooled, not yet committed
    assert spooled_ids(runtime, 0, end) == [1, 2, 3]
    runtime.settle(end, at_start=False)  # Spark's commit(end)
    assert sorted(broker.acked) == ["ID:1", "ID:2", "ID:3"]
    assert len(runtime.spool.seen) == 0 and runtime.spool.pulls() == []


def test_redelivery_of_a_committed_batch_is_acked_not_spooled(broker: FakeBroker,
                                                              tmp_path: Any) -> None:
    broker.publish(1, 2)
    first = _Runtime(config(tmp_path))
    end = run(first, 0)
    first.close()  # died after Spark committed the batch, before the ack
    second = _Runtime(config(tmp_path))
    assert run(second, end) == end  # nothing new: the redeliveries are recognised
    assert sorted(broker.acked) == ["ID:1", "ID:2"] and broker.queue == {}
    assert len(second.spool.seen) == 0


def test_a_pull_no_offset_recorded_is_dropped_and_read_again(broker: FakeBroker,
                                                             tmp_path: Any) -> None:
    broker.publish(1, 2)
    first = _Runtime(config(tmp_path))
    assert run(first, 0) == 2
    first.close()  # died before Spark wrote the offset: start is still 0
    second = _Runtime(config(tmp_path))
    assert run(second, 0) == 2  # the same messages, spooled again from seq 1
    assert spooled_ids(second, 0, 2) == [1, 2] and len(second.spool.pulls()) == 1


def test_a_recorded_batch_survives_the_restart_and_is_acked_later(broker: FakeBroker,
                                                                  tmp_path: Any) -> None:
    broker.publish(1, 2)
    first = _Runtime(config(tmp_path))
    end = run(first, 0)
    first.close()  # Spark recorded [0, 2] but died before running the batch
    second = _Runtime(config(tmp_path))
    assert spooled_ids(second, 0, end) == [1, 2]  # the re-run reads the spool
    broker.publish(3)
    # Spark committed the re-run: 1 and 2 come again and are acknowledged as such
    assert run(second, end) == 3
    assert sorted(broker.acked) == ["ID:1", "ID:2"] and list(broker.queue) == ["ID:3"]
    second.settle(3, at_start=False)
    assert sorted(broker.acked) == ["ID:1", "ID:2", "ID:3"]


def test_a_restarted_checkpoint_behind_the_spool_is_refused(broker: FakeBroker,
                                                            tmp_path: Any) -> None:
    broker.publish(1)
    first = _Runtime(config(tmp_path))
    first.settle(run(first, 0), at_start=False)
    first.close()
    with pytest.raises(ConfigurationError, match="checkpoint was lost"):
        _Runtime(config(tmp_path)).settle(0, at_start=True)


def test_two_readers_of_one_spool_are_refused(broker: FakeBroker, tmp_path: Any) -> None:
    holder = _Runtime(config(tmp_path))
    with pytest.raises(ConfigurationError, match="in use by another running query"):
        _Runtime(config(tmp_path))
    holder.close()
    _Runtime(config(tmp_path)).close()  # free again once the first reader stopped


def test_a_broker_restart_voids_the_handles_not_the_ids(broker: FakeBroker,
                                                        tmp_path: Any) -> None:
    broker.publish(1, 2)
    runtime = _Runtime(config(tmp_path))
    end = run(runtime, 0)
    assert runtime.client is not None
    runtime.client.connected = False  # the broker restarted
    runtime.settle(end, at_start=False)  # the ack cannot be confirmed: IDs kept
    assert broker.acked == [] and len(runtime.spool.seen) == 2
    assert run(runtime, end) == end  # reconnects; the redeliveries are acknowledged
    assert sorted(broker.acked) == ["ID:1", "ID:2"] and len(runtime.spool.seen) == 0


def test_a_poison_message_fails_naming_it_and_stays_unacked(broker: FakeBroker,
                                                            tmp_path: Any) -> None:
    broker.publish(1)
    broker.publish(2, body=b"{broken")
    runtime = _Runtime(config(tmp_path, body_format="json"))
    with pytest.raises(BadMessageError, match=r"'ID:2'.*not JSON"):
        run(runtime, 0)
    assert broker.acked == [] and "ID:2" in broker.queue


def test_dead_letter_moves_the_poison_message_aside(broker: FakeBroker,
                                                    tmp_path: Any) -> None:
    broker.publish(1)
    broker.publish(2, body=b"\xff\xfe")
    runtime = _Runtime(config(tmp_path, body_format="string", on_bad_message="dead-letter",
                              dead_letter_destination="/queue/dlq"))
    assert run(runtime, 0) == 1
    assert broker.sent == {"/queue/dlq": [b"\xff\xfe"]} and broker.acked == ["ID:2"]


def test_copies_under_a_producer_header_are_dropped(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Any) -> None:
    fake = FakeBroker()
    monkeypatch.setattr(connection_module, "StompClient", fake.client)
    for i, dedup in enumerate(("a", "b", "a")):  # "a" published twice by its producer
        fake.queue[f"ID:{i}"] = dedup.encode()
    original = FakeClient.receive

    def with_header(self: FakeClient, timeout: float) -> Frame | None:
        frame = original(self, timeout)
        if frame is not None:
            frame.headers["sparkeos-dedup-id"] = frame.body.decode()
        return frame

    monkeypatch.setattr(FakeClient, "receive", with_header)
    runtime = _Runtime(config(tmp_path, message_id_header="sparkeos-dedup-id"))
    assert run(runtime, 0) == 2 and fake.acked == ["ID:2"]  # the copy, at once
    runtime.settle(2, at_start=False)
    assert sorted(fake.acked) == ["ID:0", "ID:1", "ID:2"]
    assert "a" in runtime.spool.seen  # kept: a later copy is still dropped


def test_missing_id_is_an_error_naming_the_option(broker: FakeBroker, tmp_path: Any) -> None:
    broker.publish(1)
    with pytest.raises(BadMessageError, match="message_id_header"):
        run(_Runtime(config(tmp_path, message_id_header="absent")), 0)



def test_an_acknowledgement_whose_receipt_was_lost_does_not_fill_the_store(
        broker: FakeBroker, tmp_path: Any) -> None:
    """Issue 23: the ACKs reached the broker but the connection dropped before their
    RECEIPT: the broker never redelivers those messages, and their IDs stayed in the
    store for good; after enough such disconnects the source halted at its bound. Once
    a new message arrives (after every redelivery a broker still owed), they are
    forgotten; a message whose ACK was really lost is redelivered first and dropped."""
    runtime = _Runtime(config(tmp_path, max_seen_ids=40, max_batch_messages=10))
    start = 0
    for round_ in range(12):  # 12 x 3 IDs would exceed the bound of 40
        broker.publish(*(round_ * 10 + i for i in (1, 2, 3)))
        end = run(runtime, start)
        assert runtime.client is not None
        client = runtime.client
        lost = next(iter(client.inflight))  # its ACK never reaches the broker
        for handle in list(client.inflight):
            if handle != lost:
                client.ack(handle)  # these ACKs land ...
        client.connected = False  # ... and the connection drops before the RECEIPT
        runtime.settle(end, at_start=False)
        start = end
    final = run(runtime, start)
    assert final == start  # the last lost one came again and was dropped, not spooled
    assert len(runtime.spool.seen) <= 3 and broker.queue == {}
    delivered = [m for batch in read_pulls([p.path for p in runtime.spool.pulls()], 0, final)
                 for m in batch.column("message_id").to_pylist()]
    assert len(delivered) == len(set(delivered))
