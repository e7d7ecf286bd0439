"""SqlTableSink(key=...) replaces rows by key exactly once (SQLite, in-process runner)."""

from __future__ import annotations

import sqlite3
from typing import Any

import pyarrow as pa
import pytest

from sparkeos.connectors.sql import SqlTableSink
from sparkeos.core import DataRejectedError, TransactionAbortedError
from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.faults import ALL_POINTS
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.testing.inprocess import ArrowRunner, MemoryStore, crash_then_finish


def words(**counts: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"word": pa.array(list(counts), pa.string()),
                                       "n": pa.array(list(counts.values()), pa.int64())})


BATCHES = [[words(a=1, b=1), words(c=1)], [words(b=2), words()], [words(a=2), words(c=3, d=1)]]


def table(path: str) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT word, n FROM wc").fetchall())


@pytest.mark.parametrize("point", ALL_POINTS)
def test_upsert_by_key_under_a_crash_at_every_point(tmp_path: Any, point: str) -> None:
    path = str(tmp_path / "db.sqlite")
    sink = SqlTableSink(url=f"sqlite:///{path}", table="wc", create_table=True, key="word")
    assert sink.cluster_by() == ("word",)
    log = CommitLog(MemoryStore())
    crash_then_finish(lambda faults: Coordinator(sink, CoordinatorConfig(name="wc"), log,
                                                 "qtest", faults),
                      BATCHES, point, ArrowRunner)
    assert table(path) == {"a": 2, "b": 2, "c": 3, "d": 1}


def test_a_key_repeated_in_a_batch_is_refused(tmp_path: Any) -> None:
    path = str(tmp_path / "db.sqlite")
    sink = SqlTableSink(url=f"sqlite:///{path}", table="wc", create_table=True, key=["word"])
    coord = Coordinator(sink, CoordinatorConfig(name="wc"), CommitLog(MemoryStore()), "q")
    batch = pa.RecordBatch.from_pydict({"word": ["a", "a"], "n": [1, 2]})
    with pytest.raises((DataRejectedError, TransactionAbortedError),
                       match="appears more than once in batch 0"):
        coord.run_batch(0, ArrowRunner([batch]))
    assert table(path) == {}
