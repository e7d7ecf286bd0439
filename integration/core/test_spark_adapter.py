"""The foreachBatch adapter on real Spark: configuration errors, schema changes, stores."""

from __future__ import annotations

import os

import pytest

from integration.streams import id_stream, run_available
from sparkeos import ConfigurationError, exactly_once
from sparkeos.connectors.file import FileSink, read_output
from sparkeos.core.errors import RecordExistsError
from sparkeos.core.snapshot.commitlog import BEGUN, DECIDED, OUTCOME, CommitLog
from sparkeos.core.storage.logstores import HadoopStore, open_store
from sparkeos.testing.job import write_input

_stream = id_stream
_run = run_available


def _ids(path: str) -> list[int]:
    table = read_output(path)
    return sorted(table.column("id").to_pylist()) if table.num_rows else []


def test_missing_checkpoint_location_is_a_clear_error(spark, tmp_path):
    write_input(str(tmp_path / "in"), [[1, 2]])
    adapter = exactly_once(FileSink(str(tmp_path / "out")), name="nock")
    with pytest.raises(Exception, match="no checkpointLocation") as info:
        _run(_stream(spark, str(tmp_path / "in")), adapter)
    assert "What to do" in str(info.value)
    assert _ids(str(tmp_path / "out")) == []


def test_unwritable_output_fails_before_writing_then_recovers(spark, tmp_path):
    write_input(str(tmp_path / "in"), [[1, 2], [3]])
    blocker = tmp_path / "blocked"
    blocker.write_text("a file where the output directory should be")
    out, ckpt = str(blocker / "out"), str(tmp_path / "ckpt")
    df = _stream(spark, str(tmp_path / "in"))
    with pytest.raises(Exception, match="is not writable"):
        _run(df, exactly_once(FileSink(out), name="files"), ckpt)
    blocker.unlink()  # the operator fixes the destination and restarts the query
    _run(df, exactly_once(FileSink(out), name="files"), ckpt)
    assert _ids(out) == [1, 2, 3]


def test_schema_change_between_batches_is_refused_and_loses_nothing(spark, tmp_path):
    in_dir, out, ckpt = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ckpt")
    write_input(in_dir, [[1, 2]])
    df = _stream(spark, in_dir)
    _run(df, exactly_once(FileSink(out), name="files"), ckpt)
    write_input(in_dir, [[1, 2], [3, 4]])  # a second file arrives
    changed = df.selectExpr("id", "length(payload) AS payload")
    with pytest.raises(Exception, match="schema differs"):
        _run(changed, exactly_once(FileSink(out), name="files"), ckpt)
    assert _ids(out) == [1, 2]
    _run(df, exactly_once(FileSink(out), name="files"), ckpt)  # the fixed job
    assert _ids(out) == [1, 2, 3, 4]


def test_same_sink_name_for_another_destination_is_refused(spark, tmp_path):
    in_dir, ckpt = str(tmp_path / "in"), str(tmp_path / "ckpt")
    write_input(in_dir, [[1]])
    df = _stream(spark, in_dir)
    _run(df, exactly_once(FileSink(str(tmp_path / "a")), name="files"), ckpt)
    write_input(in_dir, [[1], [2]])
    with pytest.raises(Exception, match="belongs to another identity"):
        _run(df, exactly_once(FileSink(str(tmp_path / "b")), name="files"), ckpt)


def test_two_sinks_of_one_query_with_the_same_name_are_refused(spark, tmp_path):
    """Bug 4 of the concurrency issue: the second sink once found the first one's
    decided(N) in the shared commit log and silently wrote nothing."""
    in_dir, ckpt = str(tmp_path / "in"), str(tmp_path / "ckpt")
    write_input(in_dir, [[1, 2]])
    eu = exactly_once(FileSink(str(tmp_path / "eu")), name="orders")
    us = exactly_once(FileSink(str(tmp_path / "us")), name="orders")

    def both(df, batch_id):  # type: ignore[no-untyped-def]
        eu(df, batch_id)
        us(df, batch_id)

    with pytest.raises(Exception, match="both named 'orders'") as info:
        _run(_stream(spark, in_dir), both, ckpt)
    assert "its own name=" in str(info.value)
    assert _ids(str(tmp_path / "us")) == []
    # Distinct names (on a fresh checkpoint): both sinks get every row.
    eu2 = exactly_once(FileSink(str(tmp_path / "eu2")), name="orders-eu")
    us2 = exactly_once(FileSink(str(tmp_path / "us2")), name="orders-us")
    _run(_stream(spark, in_dir), lambda df, b: (eu2(df, b), us2(df, b)),
         str(tmp_path / "ckpt2"))
    assert _ids(str(tmp_path / "eu2")) == _ids(str(tmp_path / "us2")) == [1, 2]


def test_metrics_are_reported_per_batch(spark, tmp_path):
    in_dir = str(tmp_path / "in")
    write_input(in_dir, [[1, 2, 3], [4]])
    seen = []
    adapter = exactly_once(FileSink(str(tmp_path / "out")), name="files", on_batch=seen.append)
    _run(_stream(spark, in_dir), adapter, str(tmp_path / "ckpt"))
    assert [m.rows for m in seen] == [3, 1]
    assert all(m.outcome == "committed" and m.prepare_ms > 0 for m in seen)
    assert adapter.last_metrics is seen[-1]


def test_hadoop_store_through_spark_filesystem(spark, tmp_path):
    store = HadoopStore(f"file://{tmp_path}/log", spark)
    assert store.list_names() == []
    log = CommitLog(store)
    log.append(7, BEGUN, {"partitions": 2}, run=0)
    log.append(7, OUTCOME, {"outcome": DECIDED, "participants": []}, run=0)
    log.write_meta({"query_key": "k"})
    log.write_meta({"query_key": "k2"})
    state = log.batches()[7]
    assert state.needs_commit and state.begun[0]["partitions"] == 2
    assert log.read_meta() == {"query_key": "k2"}
    assert sorted(os.listdir(tmp_path / "log")) == sorted(
        n for n in os.listdir(tmp_path / "log") if not n.startswith(".tmp"))
    with pytest.raises(RecordExistsError, match="already exists"):
        log.append(7, OUTCOME, {"outcome": "aborted"}, run=0)
    assert log.claim(7, OUTCOME, {"outcome": "aborted"}, run=0)["outcome"] == DECIDED
    store.delete("sink.json")
    assert "sink.json" not in store.list_names()


def test_hadoop_store_replace_never_leaves_the_record_missing(spark, tmp_path, monkeypatch):
    """A replace that fails half-way (its temporary file gone before the rename, as
    after a crash or a lost write) leaves the old record in place: the store renames
    over it in one step instead of deleting it first."""
    store = HadoopStore(f"file://{tmp_path}/log", spark)
    store.replace("sink.json", b'{"v": 1}')
    real_write_temp = store._write_temp

    def lost_temp(data: bytes):  # written, then gone before the rename
        tmp = real_write_temp(data)
        store._fs.delete(tmp, False)
        return tmp

    monkeypatch.setattr(store, "_write_temp", lost_temp)
    with pytest.raises(Exception, match=r"FileNotFound|does not exist"):
        store.replace("sink.json", b'{"v": 2}')
    assert store.read("sink.json") == b'{"v": 1}'


def test_configuration_errors_are_typed():
    with pytest.raises(ConfigurationError, match="unknown file format"):
        FileSink("/tmp/x", format="csv")
    with pytest.raises(ConfigurationError, match="invalid sink name"):
        exactly_once(FileSink("/tmp/x"), name="no spaces please")


def test_stable_keys_on_spark(spark):
    from sparkeos.core.idempotent import KEY_COLUMN, drop_replayed, key_of, with_stable_keys

    df = spark.createDataFrame([(1, "a"), (2, None)], "id long, name string").repartition(1)
    keyed = with_stable_keys(df, 5, ["id", "name"]).collect()
    assert {r[KEY_COLUMN] for r in keyed} == {key_of([1, "a"]), key_of([2, None])}
    positional = sorted(r[KEY_COLUMN] for r in with_stable_keys(df, 5).collect())
    assert positional == ["5-0-0", "5-0-1"]
    twice = with_stable_keys(df.union(df), 5, ["id"])
    assert drop_replayed(twice).count() == 2


def test_key_of_equals_spark_keys_for_every_supported_type(spark):
    """Issue 8, defect 4: `key_of` in Python and `with_stable_keys` in Spark give the
    same key, over random rows of every type key_of accepts (strings with separators,
    empty strings, unicode, null markers; booleans, integers, dates, decimals)."""
    import datetime as dt
    import random
    from decimal import Decimal

    from sparkeos.core.idempotent import KEY_COLUMN, key_of, with_stable_keys

    rnd = random.Random(8)
    alphabet = ["a", "b", "\x1f", "\x00", ":", "1", "N", "é", "😀", " ", ""]

    def text():  # type: ignore[no-untyped-def]
        return None if rnd.random() < 0.15 else "".join(
            rnd.choice(alphabet) for _ in range(rnd.randrange(0, 5)))

    def maybe(value):  # type: ignore[no-untyped-def]
        return None if rnd.random() < 0.15 else value

    rows = [(i, text(), text(), maybe(rnd.random() < 0.5),
             maybe(rnd.randrange(-2**63, 2**63)),
             maybe(dt.date(1, 1, 1) + dt.timedelta(days=rnd.randrange(0, 3_000_000))),
             maybe(Decimal(rnd.randrange(-10**12, 10**12)).scaleb(-3)))
            for i in range(500)]
    schema = ("i long, s1 string, s2 string, b boolean, n long, d date, "
              "m decimal(18,3)")
    df = spark.createDataFrame(rows, schema)
    columns = ["s1", "s2", "b", "n", "d", "m"]
    keyed = {r["i"]: r[KEY_COLUMN] for r in with_stable_keys(df, 0, columns).collect()}
    expected = {row[0]: key_of(list(row[1:])) for row in rows}
    assert keyed == expected
    # Different key values, different keys (within this sample).
    distinct_values = {tuple(row[1:]) for row in rows}
    assert len(set(expected.values())) == len(distinct_values)


def test_a_lost_checkpoint_is_refused_not_written_twice(spark, tmp_path):
    """Issue 15, defect 1: the checkpoint is deleted, the output kept; the restarted
    query once wrote every row again beside the old files, silently."""
    in_dir, out = str(tmp_path / "in"), str(tmp_path / "out")
    write_input(in_dir, [[1, 2], [3]])
    _run(_stream(spark, in_dir), exactly_once(FileSink(out), name="files"),
         str(tmp_path / "ckpt"))
    assert _ids(out) == [1, 2, 3]
    with pytest.raises(Exception, match="written by another query") as info:
        _run(_stream(spark, in_dir), exactly_once(FileSink(out), name="files"),
             str(tmp_path / "ckpt-new"))
    assert "restore the checkpoint" in str(info.value)
    assert _ids(out) == [1, 2, 3]
    # Re-processing on purpose is the user's explicit choice.
    _run(_stream(spark, in_dir), exactly_once(FileSink(out), name="files",
                                              existing_output="accept"),
         str(tmp_path / "ckpt-new2"))
    assert _ids(out) == [1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("writers, expected", [(None, 2), (3, 3), (20, 8)])
def test_writers_bound_the_participants_of_a_many_partition_batch(spark, tmp_path, writers,
                                                                   expected):
    """A batch of 8 partitions is written by at most ``writers`` transactions (default:
    the executors' cores, 2 on local[2]); every row once. begun records the bound, so
    every ID that may exist is on record before any task writes."""
    in_dir, out, ckpt = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "ckpt")
    write_input(in_dir, [list(range(100)), list(range(100, 150))])
    seen: list = []
    settings = {} if writers is None else {"writers": writers}
    adapter = exactly_once(FileSink(out), name="files", on_batch=seen.append, **settings)
    _run(_stream(spark, in_dir).repartition(8), adapter, ckpt)
    assert [m.partitions for m in seen] == [expected, expected]
    assert _ids(out) == list(range(150))
    states = CommitLog(open_store(os.path.join(ckpt, "sparkeos", "files"))).batches()
    for batch in (0, 1):
        assert [begun["partitions"] for begun in states[batch].begun.values()] == [
            writers or 2]
        decided = states[batch].outcomes[0]
        assert decided["outcome"] == DECIDED and len(decided["participants"]) == expected


def test_writers_must_be_a_positive_whole_number():
    with pytest.raises(ConfigurationError, match="writers=0"):
        exactly_once(FileSink("/tmp/x"), name="files", writers=0)
