"""StompSink's duplicate IDs name each message by its content and occurrence, so a
replay of the same rows in another order (a shuffle upstream) gives every message the
ID it had. By position, a publish that died part-way and a reordered replay make the
broker drop messages it never held. The broker here keeps Artemis' rule (a message whose
``_AMQ_DUPL_ID`` it has seen is dropped); the real broker runs in the conformance
suite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from sparkeos.connectors.stomp import StompSink
from sparkeos.connectors.stomp import sink as stomp_sink
from sparkeos.core.snapshot.txpool import DIRECT_RUNS, TransactionPool


class Killed(Exception):
    """The executor dies in the middle of a publish."""


class DuplicateDetectingBroker:
    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.queue: list[str] = []
        self.die_after: int | None = None

    def publish(self, connect: Any, txn: Any, messages: Iterator[Any]) -> None:
        for sent, (_destination, body, headers) in enumerate(messages):
            if sent == self.die_after:
                raise Killed(f"killed after {sent} messages")
            if headers["_AMQ_DUPL_ID"] not in self.ids:
                self.ids.add(headers["_AMQ_DUPL_ID"])
                self.queue.append(body.decode())


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> DuplicateDetectingBroker:
    fake = DuplicateDetectingBroker()
    monkeypatch.setattr(stomp_sink.publish, "publish", fake.publish)
    return fake


def _send(sink: StompSink, run: int, rows: list[str]) -> None:
    """One at-least-once task of batch 5, partition 0: stage, then publish."""
    txn = TransactionPool("q1", "stomp").transaction(5, 0, run, 0)
    handle = sink.begin(txn)
    sink.write(handle, pa.record_batch({"body": rows}))
    sink.commit(txn, sink.prepare(handle))


def test_a_reordered_replay_of_a_half_sent_participant_loses_nothing(
        broker: DuplicateDetectingBroker, tmp_path: Any) -> None:
    sink = StompSink("stomp://u:p@127.0.0.1:1", destination="out", body_column="body",
                     staging_dir=str(tmp_path), fsync=False)
    sink.__dict__["_mark"] = sink.staging.check_on_driver(None)
    broker.die_after = 2
    with pytest.raises(Killed):
        _send(sink, DIRECT_RUNS.start + 1, ["A", "B", "C", "B"])
    broker.die_after = None
    _send(sink, DIRECT_RUNS.start + 2, ["B", "C", "B", "A"])
    assert sorted(broker.queue) == ["A", "B", "B", "C"], (
        "a message of the replay took the ID of another row and was dropped")
