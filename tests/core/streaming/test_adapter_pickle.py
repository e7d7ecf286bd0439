"""The foreachBatch adapter and every sink pickle cleanly: Spark Connect ships the
function to a server-side Python process (cloudpickle), so nothing of this process
(locks, connections, sessions) may travel with it."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from pyspark import cloudpickle  # what Spark Connect pickles the function with

from sparkeos import at_least_once, exactly_once
from sparkeos.connectors.file import FileSink
from sparkeos.connectors.jdbc import PostgresSink
from sparkeos.connectors.kafka import KafkaSink
from sparkeos.connectors.sql import SqlTableSink
from sparkeos.connectors.stomp import StompSink
from sparkeos.core.streaming.queryrun import QueryRun

SINKS: dict[str, Any] = {
    "file": lambda tmp: FileSink(str(tmp / "out")),
    "postgres": lambda tmp: PostgresSink(dsn="postgresql://app@db:5432/shop", table="t"),
    "kafka": lambda tmp: KafkaSink("broker:9092", topic="orders",
                                   staging_dir=str(tmp / "staging")),
    "sql": lambda tmp: SqlTableSink(url=f"sqlite:///{tmp}/db.sqlite", table="t"),
    "stomp": lambda tmp: StompSink("stomp://127.0.0.1:61613", destination="/queue/q"),
}


@pytest.mark.parametrize("kind", sorted(SINKS))
@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloud"])
def test_sinks_and_adapters_pickle(kind, dumps, tmp_path):
    sink = SINKS[kind](tmp_path)
    assert pickle.loads(dumps(sink)) == sink
    for wrap in (exactly_once, at_least_once):
        adapter = wrap(sink, name=f"{kind}-sink")
        clone = pickle.loads(dumps(adapter))
        assert clone.config == adapter.config and clone.sink == adapter.sink
        assert clone._run is None and clone._lock is not adapter._lock


def test_a_used_adapter_pickles_without_its_coordinator(tmp_path):
    adapter = exactly_once({"a": FileSink(str(tmp_path / "a")),
                            "b": (FileSink(str(tmp_path / "b")), lambda df: df)}, name="grp")
    adapter._run = QueryRun(("q", "r"))  # what a batch leaves behind: not shipped
    adapter._run.coordinator = object()
    clone = cloudpickle.loads(cloudpickle.dumps(adapter))
    assert clone._run is None
    assert sorted(clone.frames) == ["b"]
