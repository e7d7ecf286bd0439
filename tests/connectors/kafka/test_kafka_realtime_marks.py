"""Where KafkaSink's real-time mark is read back from the progress records (its marker
offset expired): the last record of an epoch wins, as the marker offset would."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sparkeos.connectors.kafka import KafkaSink, markers
from sparkeos.connectors.kafka.realtime import MARK_KEY
from sparkeos.core.snapshot.txpool import TransactionPool


class Record:
    def __init__(self, key: str, value: dict[str, Any]) -> None:
        self._key, self._value = key.encode(), json.dumps(value).encode()

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value


def test_the_later_record_of_an_epoch_wins_when_neither_says_what_it_wrote(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sink = KafkaSink("127.0.0.1:1", topic="out")
    txn = TransactionPool("q", "rt").transaction(4, 0, 0, 0)
    group = markers.marker_group(sink, txn)
    first = {"batch": 4, MARK_KEY: {"end": 1378}, "txn": "a"}
    replay = {"batch": 4, MARK_KEY: {"end": 1272}, "txn": "b"}
    other = {"batch": 9, MARK_KEY: {"end": 1}, "txn": "c"}
    monkeypatch.setattr(markers, "_progress_records", lambda _config: [
        Record(group, first), Record(group + "0", other), Record(group, replay)])
    assert markers._last_progress(sink, txn, "test") == replay


def test_a_record_that_says_what_it_wrote_is_kept_over_a_later_one_that_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sink = KafkaSink("127.0.0.1:1", topic="out")
    txn = TransactionPool("q", "s").transaction(2, 1, 0, 0)
    group = markers.marker_group(sink, txn)
    known = {"batch": 2, "rows": 3, "fingerprint": "f" * 32, "txn": "a"}
    monkeypatch.setattr(markers, "_progress_records", lambda _config: [
        Record(group, known), Record(group, {"batch": 2, "txn": "b"})])
    assert markers._last_progress(sink, txn, "test") == known
