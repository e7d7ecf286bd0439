"""The file sink's participant hooks, without Spark."""

from __future__ import annotations

import os

import pytest

from sparkeos.connectors.file import FileSink, committed_files, read_output
from sparkeos.connectors.file.sink import STAGING_DIR
from sparkeos.core.errors import ConfigurationError, DataLossError
from sparkeos.core.protocol import TxnState
from sparkeos.core.snapshot.txpool import TransactionPool
from sparkeos.testing.inprocess import ID_SCHEMA, id_batch

POOL = TransactionPool("q0", "files")


def ids(path: str, fmt: str = "parquet") -> list[int]:
    table = read_output(path, fmt)
    return sorted(table.column("id").to_pylist()) if table.num_rows else []


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_prepare_is_invisible_commit_is_idempotent(tmp_path, fmt):
    sink = FileSink(str(tmp_path), format=fmt)
    sink.validate(ID_SCHEMA)
    txn = POOL.transaction(0, 0, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, id_batch([1, 2]))
    sink.write(handle, id_batch([3]))
    receipt = sink.prepare(handle)
    assert receipt["rows"] == 3
    assert committed_files(str(tmp_path), fmt) == []
    assert sink.probe(txn) is TxnState.PREPARED
    sink.commit(txn, receipt)
    sink.commit(txn, receipt)  # a replayed commit is a no-op
    assert sink.probe(txn) is TxnState.COMMITTED
    table = read_output(str(tmp_path), fmt)
    assert sorted(table.column("id").to_pylist()) == [1, 2, 3]
    assert [n for n in os.listdir(tmp_path / STAGING_DIR) if not n.startswith(".")] == []


@pytest.mark.parametrize(("fmt", "compression", "extension"), [
    ("parquet", "snappy", ".snappy.parquet"), ("parquet", "UNCOMPRESSED", ".parquet"),
    ("parquet", "zstd", ".zstd.parquet"), ("jsonl", "snappy", ".json")])
def test_part_files_are_named_as_sparks_writer_names_them(tmp_path, fmt, compression,
                                                          extension):
    """A downstream ``*.json`` / ``*.snappy.parquet`` glob finds the part files, as it
    finds Spark's own; JSON Lines files of an earlier version (``.jsonl``) are still
    listed, read and recognised as committed."""
    sink = FileSink(str(tmp_path), format=fmt, compression=compression)
    sink.validate(ID_SCHEMA)
    txn = POOL.transaction(0, 0, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, id_batch([1]))
    sink.commit(txn, sink.prepare(handle))
    [committed] = committed_files(str(tmp_path), fmt)
    assert committed.endswith(extension) and not committed.endswith("." + extension)
    if fmt == "jsonl":
        older = POOL.transaction(1, 0, 0, 0)
        name = os.path.basename(committed).replace("0000000000", "0000000001")
        os.rename(committed, tmp_path / name.replace(".json", ".jsonl"))
        assert sink.probe(older) is TxnState.COMMITTED
        assert ids(str(tmp_path), fmt) == [1]


def test_rollback_touches_one_attempt_and_sweep_the_rest(tmp_path):
    from sparkeos.core.snapshot.txpool import AttemptRange

    sink = FileSink(str(tmp_path))
    sink.validate(ID_SCHEMA)
    first, second = POOL.transaction(2, 1, 0, 0), POOL.transaction(2, 1, 0, 1)
    for txn in (first, second):
        h = sink.begin(txn)
        sink.write(h, id_batch([7]))
        sink.prepare(h)
    sink.rollback(first)
    sink.rollback(first)  # idempotent, and fine for IDs never used
    sink.rollback(POOL.transaction(9, 9, 0, 0))
    assert sink.probe(first) is TxnState.ABSENT
    assert sink.probe(second) is TxnState.PREPARED  # another attempt's: untouched
    other = FileSink(str(tmp_path))
    other.validate(ID_SCHEMA)
    foreign = POOL.transaction(3, 0, 0, 0)  # not covered by the range below
    other.prepare(other.begin(foreign))
    sink.sweep([AttemptRange("q0", "files", 2, 0, 2, 4)], frozenset())
    assert sink.probe(second) is TxnState.ABSENT and ids(str(tmp_path)) == []
    assert sink.probe(foreign) is TxnState.OPEN


def test_only_the_decided_attempt_is_committed(tmp_path):
    sink = FileSink(str(tmp_path))
    sink.validate(ID_SCHEMA)
    zombie = sink.begin(POOL.transaction(0, 0, 0, 0))
    sink.write(zombie, id_batch([99]))
    winner_txn = POOL.transaction(0, 0, 0, 1)
    winner = sink.begin(winner_txn)
    sink.write(winner, id_batch([1]))
    receipt = sink.prepare(winner)
    sink.prepare(zombie)
    sink.commit(winner_txn, receipt)
    assert ids(str(tmp_path)) == [1]


def test_empty_partition_commits_nothing(tmp_path):
    sink = FileSink(str(tmp_path))
    sink.validate(ID_SCHEMA)
    txn = POOL.transaction(0, 0, 0, 0)
    receipt = sink.prepare(sink.begin(txn))
    sink.commit(txn, receipt)
    assert committed_files(str(tmp_path)) == []


def test_vanished_staging_of_a_decided_transaction_is_data_loss(tmp_path):
    sink = FileSink(str(tmp_path))
    sink.validate(ID_SCHEMA)
    txn = POOL.transaction(4, 0, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, id_batch([1]))
    receipt = sink.prepare(handle)
    sink.rollback(txn)  # someone deleted the hidden staging directory
    with pytest.raises(DataLossError, match="batch=4") as info:
        sink.commit(txn, receipt)
    assert "What to do" in str(info.value)


def test_two_sinks_of_one_query_share_a_directory(tmp_path):
    """Issue 8, defect 1: part names carry the sink name."""
    eu, us = TransactionPool("q0", "orders-eu"), TransactionPool("q0", "orders-us")
    sink = FileSink(str(tmp_path))
    sink.validate(ID_SCHEMA)
    for pool, rows in ((eu, [1, 2]), (us, [3])):
        txn = pool.transaction(0, 0, 0, 0)
        handle = sink.begin(txn)
        sink.write(handle, id_batch(rows))
        sink.commit(txn, sink.prepare(handle))
    assert ids(str(tmp_path)) == [1, 2, 3]


def test_validate_refuses_an_unwritable_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigurationError, match="not writable"):
        FileSink(str(blocker / "out")).validate(ID_SCHEMA)


def test_config_is_validated_at_construction():
    with pytest.raises(ConfigurationError, match="needs a path"):
        FileSink("")
    with pytest.raises(ConfigurationError, match=r"object store.*conditional writes"):
        FileSink("oss://bucket/out")
    assert FileSink("s3a://bucket/out/").directory == "s3a://bucket/out"
    assert FileSink("gs://bucket/out/").directory == "gs://bucket/out"
    with pytest.raises(ConfigurationError, match="cannot write files on ftp://"):
        FileSink("ftp://host/out")
    with pytest.raises(ConfigurationError, match="names no NameNode"):
        FileSink("hdfs:///out")
    assert FileSink("webhdfs://nn:9870/out/").directory == "webhdfs://nn:9870/out"
    assert FileSink("/tmp/x").describe() == {"path": "/tmp/x", "format": "parquet",
                                             "compression": "snappy", "fsync": True,
                                             "partition_by": [], "spark_settings": None}


def test_a_directory_the_driver_does_not_share_is_refused_before_writing(tmp_path):
    """Issue 8, defect 2: a task that does not see the driver's check file refuses
    with a ConfigurationError naming the path, before anything is staged or decided."""
    from sparkeos.core.config import CoordinatorConfig
    from sparkeos.core.snapshot.commitlog import CommitLog
    from sparkeos.core.snapshot.coordinator import Coordinator
    from sparkeos.core.storage.fsutil import MARK_PREFIX
    from sparkeos.testing.inprocess import ListRunner, MemoryStore

    sink = FileSink(str(tmp_path / "out"))
    sink.validate(ID_SCHEMA)
    staging = tmp_path / "out" / STAGING_DIR
    assert list(staging.glob(MARK_PREFIX + "*"))

    class ExecutorElsewhere(FileSink):
        def begin(self, txn):
            for mark in staging.glob(MARK_PREFIX + "*"):  # the executor's view
                mark.unlink()
            return super().begin(txn)

    log = CommitLog(MemoryStore())
    coord = Coordinator(ExecutorElsewhere(str(tmp_path / "out")),
                        CoordinatorConfig(name="files"), log, "q0")
    with pytest.raises(ConfigurationError, match="is not shared") as info:
        coord.run_batch(0, ListRunner([[1], [2]]))
    assert "same path" in str(info.value)
    assert log.batches()[0].aborted == {0} and ids(str(tmp_path / "out")) == []
    # Once the directory is shared (the driver's mark is visible), the restarted query
    # writes the batch.
    Coordinator(FileSink(str(tmp_path / "out")), CoordinatorConfig(name="files"), log,
                "q0").run_batch(
        0, ListRunner([[1], [2]]))
    assert ids(str(tmp_path / "out")) == [1, 2]


def test_a_staged_file_from_another_host_is_a_configuration_error(tmp_path):
    sink = FileSink(str(tmp_path))
    sink.validate(ID_SCHEMA)
    txn = POOL.transaction(0, 0, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, id_batch([1]))
    receipt = sink.prepare(handle)
    sink.rollback(txn)
    with pytest.raises(ConfigurationError, match="not shared"):
        sink.commit(txn, {**receipt, "host": "another-host"})


def test_a_stale_copy_of_the_directory_is_not_taken_for_the_shared_one(tmp_path):
    """Issue 23, item 5: an executor whose path holds an old copy of the staging
    directory (with an earlier driver's mark in it) must not stage there: the batch would
    be decided and the driver could never commit it. Each query run marks the directory
    afresh, so only the driver's own directory passes."""
    import shutil

    from sparkeos.core.config import CoordinatorConfig
    from sparkeos.core.snapshot.commitlog import CommitLog
    from sparkeos.core.snapshot.coordinator import Coordinator
    from sparkeos.testing.inprocess import ListRunner, MemoryStore

    out = tmp_path / "out"
    staging, stale = out / STAGING_DIR, tmp_path / "stale-copy"
    earlier = FileSink(str(out))
    earlier.validate(ID_SCHEMA)  # an earlier query run marked the directory
    shutil.copytree(staging, stale)  # ... and an executor's disk kept a copy of it

    class ExecutorWithStaleCopy(FileSink):
        def begin(self, txn):
            shutil.rmtree(staging)  # what this executor sees at the same path
            shutil.copytree(stale, staging)
            return super().begin(txn)

    log = CommitLog(MemoryStore())
    coord = Coordinator(ExecutorWithStaleCopy(str(out)), CoordinatorConfig(name="files"),
                        log, "q0")
    with pytest.raises(ConfigurationError, match="is not shared"):
        coord.run_batch(0, ListRunner([[1], [2]]))
    assert log.batches()[0].aborted == {0} and ids(str(out)) == []


def test_an_empty_partition_leaves_no_local_temp_directory_on_hdfs(tmp_path, monkeypatch):
    """Issue 23, item 10: on HDFS a task writes its part file on local disk first; an
    empty partition left one `sparkeos-part-*` directory behind per batch, on every
    executor. Here a POSIX directory stands in for HDFS (a Files that is not local, so
    the sink takes the upload path)."""
    import dataclasses
    import tempfile

    from sparkeos.core.storage.stores.local import LocalFiles

    @dataclasses.dataclass(frozen=True)
    class UploadedFiles(LocalFiles):
        @property
        def is_local(self) -> bool:
            return False

    local_tmp = tmp_path / "executor-tmp"
    local_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(local_tmp))
    sink = FileSink(str(tmp_path / "out"))
    sink.__dict__["_files"] = UploadedFiles()
    sink.validate(ID_SCHEMA)
    empty, full, failed = (POOL.transaction(0, p, 0, 0) for p in range(3))
    assert sink.prepare(sink.begin(empty)) == {"file": None, "rows": 0}
    handle = sink.begin(full)
    sink.write(handle, id_batch([1, 2]))
    sink.commit(full, sink.prepare(handle))
    handle = sink.begin(failed)
    sink.write(handle, id_batch([3]))
    sink.abort(handle, failed)
    assert ids(str(tmp_path / "out")) == [1, 2]
    assert list(local_tmp.iterdir()) == []


def test_at_least_once_leaves_no_staging_of_a_killed_run_behind(tmp_path):
    """A task of an at-least-once run killed mid-write leaves its staging directory;
    the next query run sweeps it before its first batch (which replays that batch)."""
    from sparkeos.core.config import CoordinatorConfig, Guarantee
    from sparkeos.core.snapshot.coordinator import Coordinator
    from sparkeos.testing.inprocess import ListRunner

    config = CoordinatorConfig(name="files", guarantee=Guarantee.AT_LEAST_ONCE)
    first = Coordinator(FileSink(str(tmp_path)), config, None, "q0")
    first.run_batch(0, ListRunner([[1], [2]]))
    sink = FileSink(str(tmp_path))
    sink.validate(ID_SCHEMA)
    killed = sink.begin(first.pool.transaction(1, 0, first._direct_run, 0))
    sink.write(killed, id_batch([3]))  # ... and the worker is killed
    staging = tmp_path / STAGING_DIR
    assert [n for n in os.listdir(staging) if not n.startswith(".")]
    Coordinator(FileSink(str(tmp_path)), config, None, "q0").run_batch(
        1, ListRunner([[3], [4]]))
    assert ids(str(tmp_path)) == [1, 2, 3, 4]
    assert [n for n in os.listdir(staging) if not n.startswith(".")] == []
