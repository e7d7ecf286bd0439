"""``IcebergSink(key=...)``: update-mode rows upserted by key, each batch once
(pyiceberg's SQL catalog on SQLite, local paths; no Spark)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkeos.connectors.iceberg import IcebergSink
from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import (
    ConfigurationError,
    DataRejectedError,
    SchemaMismatchError,
    TransactionAbortedError,
)
from sparkeos.core.faults import ALL_POINTS
from sparkeos.core.protocol import Receipt, Transaction
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.txpool import TransactionPool
from sparkeos.testing.inprocess import ArrowRunner, MemoryStore, crash_then_finish

POOL = TransactionPool("q1", "wc")
SCHEMA = pa.schema([("word", pa.string()), ("n", pa.int64())])


def make_sink(tmp_path: Path, key: Any = ("word",)) -> IcebergSink:
    os.makedirs(tmp_path / "warehouse", exist_ok=True)
    return IcebergSink("db.wc", catalog={"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db",
                                         "warehouse": f"file://{tmp_path}/warehouse"},
                       key=key)


def words(**counts: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"word": pa.array(list(counts), pa.string()),
                                       "n": pa.array(list(counts.values()), pa.int64())})


def counts(sink: IcebergSink) -> list[dict[str, Any]]:
    found = sink._load()
    rows = [] if found is None else found.scan().to_arrow().to_pylist()
    return sorted(rows, key=str)


def staged(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "warehouse").rglob("staging/**/*.parquet"))


def prepared(sink: IcebergSink, batch_id: int, rows: pa.RecordBatch) -> tuple[
        Transaction, Receipt]:
    txn = POOL.transaction(batch_id, 0, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, rows)
    return txn, sink.prepare(handle)


WORD_BATCHES = [[words(a=1, b=1), words(c=1)], [words(b=2), words()],
                [words(a=2), words(c=3, d=1)]]


@pytest.mark.parametrize("point", ALL_POINTS)
def test_upsert_by_key_under_a_crash_at_every_point(tmp_path: Path, point: str) -> None:
    """Update-mode counts upserted by key, each batch once, through the coordinator with
    a crash at every protocol point of batch 1 and a restart; no staged rows left."""
    sink = make_sink(tmp_path)
    assert sink.cluster_by() == ("word",)
    sink.validate(SCHEMA)
    log = CommitLog(MemoryStore())
    crash_then_finish(lambda faults: Coordinator(sink, CoordinatorConfig(name="wc"), log,
                                                 "qtest", faults),
                      WORD_BATCHES, point, ArrowRunner)
    assert counts(sink) == [{"word": "a", "n": 2}, {"word": "b", "n": 2},
                            {"word": "c", "n": 3}, {"word": "d", "n": 1}]
    assert staged(tmp_path) == []


def test_a_key_repeated_in_a_batch_is_refused(tmp_path: Path) -> None:
    sink = make_sink(tmp_path, key="word")
    sink.validate(SCHEMA)
    coord = Coordinator(sink, CoordinatorConfig(name="wc"), CommitLog(MemoryStore()), "q")
    repeated = pa.RecordBatch.from_pydict({"word": ["a", "a"], "n": [1, 2]})
    with pytest.raises((DataRejectedError, TransactionAbortedError), match="twice"):
        coord.run_batch(0, ArrowRunner([repeated]))
    assert counts(sink) == [] and staged(tmp_path) == []


def test_a_late_twin_of_an_older_batch_changes_nothing(tmp_path: Path) -> None:
    """Batch 1 set a=5, batch 2 a=7; a twin committer of batch 1 that comes late (its
    reply was lost) must not bring a=5 back: the batch property keeps each batch to one
    merge."""
    sink = make_sink(tmp_path)
    sink.validate(SCHEMA)
    late = prepared(sink, 1, words(a=5))
    sink.commit_merged([late], recovering=False)
    sink.commit_merged([prepared(sink, 2, words(a=7))], recovering=False)
    sink.commit_merged([late], recovering=True)  # its staged rows are gone: no loss
    assert counts(sink) == [{"word": "a", "n": 7}]


def test_an_empty_batch_and_a_null_key(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    sink.validate(SCHEMA)
    none = pa.RecordBatch.from_pydict({"word": pa.array([None, "a"], pa.string()),
                                       "n": pa.array([1, 1], pa.int64())})
    for batch_id, rows in enumerate([none, words(), none]):
        txn, receipt = prepared(sink, batch_id, rows)
        sink.commit(txn, receipt)
    assert counts(sink) == sorted([{"word": None, "n": 1}, {"word": "a", "n": 1}], key=str)


def test_a_key_of_two_columns(tmp_path: Path) -> None:
    sink = make_sink(tmp_path, key=("word", "day"))
    schema = pa.schema([("word", pa.string()), ("day", pa.int64()), ("n", pa.int64())])
    sink.validate(schema)

    def rows(*items: tuple[str | None, int | None, int]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist(
            [{"word": w, "day": d, "n": n} for w, d, n in items], schema=schema)

    for batch_id, batch in enumerate([rows(("a", 1, 1), ("a", 2, 1), (None, None, 1)),
                                      rows(("a", 2, 5), (None, None, 3), ("b", 1, 1))]):
        sink.commit(*prepared(sink, batch_id, batch))
    assert counts(sink) == sorted(
        [{"word": "a", "day": 1, "n": 1}, {"word": "a", "day": 2, "n": 5},
         {"word": None, "day": None, "n": 3}, {"word": "b", "day": 1, "n": 1}], key=str)


def test_at_least_once_each_task_upserts_its_own_rows(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    sink.validate(SCHEMA)
    per_task = sink.for_guarantee(Guarantee.AT_LEAST_ONCE)
    for batch_id, batch in enumerate([words(a=1), words(a=3, b=1)]):
        for attempt in range(2):  # a replay of the task: the same rows again
            txn = POOL.transaction(batch_id, 0, attempt, 0)
            handle = per_task.begin(txn)
            per_task.write(handle, batch)
            per_task.commit(txn, per_task.prepare(handle))
    assert counts(sink) == [{"word": "a", "n": 3}, {"word": "b", "n": 1}]
    assert staged(tmp_path) == []


def test_a_key_the_stream_lacks_is_refused_up_front(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="key column 'id'"):
        make_sink(tmp_path, key=("id",)).validate(SCHEMA)


def test_nan_keys_match_nan_and_a_nested_key_is_refused(tmp_path: Path) -> None:
    """Spark groups NaN with NaN: a NaN key replaces the NaN row (no literal in
    Iceberg's expressions, IsNaN). A struct key is refused before any batch."""
    sink = make_sink(tmp_path, key=("x",))
    schema = pa.schema([("x", pa.float64()), ("n", pa.int64())])
    sink.validate(schema)
    nan = float("nan")
    for batch_id, (xs, ns) in enumerate([([nan, 1.5], [1, 1]), ([nan], [4])]):
        batch = pa.RecordBatch.from_pydict({"x": pa.array(xs, pa.float64()),
                                            "n": pa.array(ns, pa.int64())})
        sink.commit(*prepared(sink, batch_id, batch))
    rows = sink._load().scan().to_arrow().to_pylist()
    assert sorted(r["n"] for r in rows) == [1, 4] and len(rows) == 2
    nested = pa.schema([("k", pa.struct([("a", pa.int64())])), ("n", pa.int64())])
    with pytest.raises(ConfigurationError, match="plain values"):
        make_sink(tmp_path / "other", key=("k",)).validate(nested)


def test_a_renamed_key_column_stops_the_batch_with_the_fix(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    sink.validate(SCHEMA)
    sink.commit(*prepared(sink, 0, words(a=1)))
    txn, receipt = prepared(sink, 1, words(a=2))
    with sink._load().update_schema() as update:  # another writer, after phase 1
        update.rename_column("word", "term")
    with pytest.raises(SchemaMismatchError, match="restore the key column"):
        sink.commit(txn, receipt)


def test_a_rollback_leaves_no_staged_rows_or_directories(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    sink.validate(SCHEMA)
    txn, _ = prepared(sink, 0, words(a=1))
    sink.rollback(txn)
    committed = prepared(sink, 1, words(b=1))
    sink.commit(*committed)
    assert staged(tmp_path) == []
    assert not any(p.is_dir() for p in (tmp_path / "warehouse").rglob("staging/*"))
    assert counts(sink) == [{"word": "b", "n": 1}]


def test_a_merge_that_landed_though_reported_failed_is_kept_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog applies the commit and the reply says it failed (a lost reply): the
    retry finds the batch in the table and stops without deleting the files that the
    landed snapshot references (a delete adds no snapshot pyiceberg could look for)."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table import Table

    sink = make_sink(tmp_path)
    sink.validate(SCHEMA)
    sink.commit(*prepared(sink, 0, words(a=1, b=1)))
    applied = Table._do_commit
    lost: list[int] = []

    def lost_reply(self: Any, *args: Any, **kwargs: Any) -> Any:
        applied(self, *args, **kwargs)
        if not lost:
            lost.append(1)
            raise CommitFailedException("the reply was lost")

    monkeypatch.setattr(Table, "_do_commit", lost_reply)
    sink.commit(*prepared(sink, 1, words(a=5, c=1)))
    assert lost == [1]
    assert counts(sink) == [{"word": "a", "n": 5}, {"word": "b", "n": 1},
                            {"word": "c", "n": 1}]



def unreferenced(sink: IcebergSink, tmp_path: Path) -> set[str]:
    """The data files on disk that no snapshot of the table references (current or
    older: a merge's delete leaves the files it removed to time travel)."""
    from sparkeos.connectors.iceberg import table

    found = sink._load()
    assert found is not None
    on_disk = {f"file://{p}" for p in (tmp_path / "warehouse").rglob("data/*.parquet")}
    return on_disk - table.referenced(found, on_disk)


def refuse_commits(monkeypatch: pytest.MonkeyPatch, error: Exception, times: int) -> None:
    """The catalog answers the next ``times`` commits with ``error`` without applying
    them; later ones go through."""
    from pyiceberg.table import Table

    applied = Table._do_commit
    refused: list[int] = []

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(refused) < times:
            refused.append(1)
            raise error
        return applied(self, *args, **kwargs)

    monkeypatch.setattr(Table, "_do_commit", refuse)


def test_a_merge_refused_by_the_catalog_leaves_none_of_its_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer committed first (the catalog refuses the merge, pyiceberg's own
    retries too): the files pyiceberg wrote for the refused merge are deleted, and the
    next try lands."""
    from pyiceberg.exceptions import CommitFailedException

    sink = make_sink(tmp_path)
    sink.validate(SCHEMA)
    sink.commit(*prepared(sink, 0, words(a=1, b=1)))
    # The first try, and pyiceberg's 4 retries of it.
    refuse_commits(monkeypatch, CommitFailedException("another writer committed first"), 5)
    sink.commit(*prepared(sink, 1, words(a=5, c=1)))
    assert counts(sink) == [{"word": "a", "n": 5}, {"word": "b", "n": 1},
                            {"word": "c", "n": 1}]
    assert unreferenced(sink, tmp_path) == set()


def test_a_merge_whose_outcome_is_unknown_keeps_its_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog's answer is lost without a verdict (``CommitStateUnknownException``):
    the merge may land later (a REST catalog applying a request it timed out on), so its
    files stay, even after a second try landed the batch."""
    from pyiceberg.exceptions import CommitStateUnknownException

    sink = make_sink(tmp_path)
    sink.validate(SCHEMA)
    sink.commit(*prepared(sink, 0, words(a=1)))
    refuse_commits(monkeypatch, CommitStateUnknownException("the catalog did not answer"), 1)
    sink.commit(*prepared(sink, 1, words(a=5)))
    assert counts(sink) == [{"word": "a", "n": 5}]
    assert unreferenced(sink, tmp_path), (
        "the first try's files were deleted though it might still land")

def test_an_upsert_whose_twin_merges_between_its_check_and_its_read_is_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sparkeos recover`` beside the driver: the twin merges the batch and deletes its
    staged rows after this committer found them there and before it read them. The
    batch is done, once; no error."""
    from sparkeos.connectors.iceberg import upsert

    sink = make_sink(tmp_path)
    sink.validate(SCHEMA)
    txn, receipt = prepared(sink, 0, words(a=5))
    real_read = upsert.staged_rows
    twins: list[int] = []

    def twin_first(store: Any, uris: Any) -> Any:
        twins.append(1)
        monkeypatch.setattr(upsert, "staged_rows", real_read)
        make_sink(tmp_path).recover_commit(txn, dict(receipt))  # type: ignore[arg-type]
        return real_read(store, uris)

    monkeypatch.setattr(upsert, "staged_rows", twin_first)
    sink.commit(txn, receipt)
    assert twins == [1]
    assert counts(sink) == [{"word": "a", "n": 5}]
