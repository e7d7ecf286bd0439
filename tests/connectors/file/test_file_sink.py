"""The file sink's participant hooks, without Spark."""

from __future__ import annotations

import os

import pytest

from sparkeos.connectors.file import FileSink, committed_files, read_output
from sparkeos.connectors.file.sink import STAGING_DIR
from sparkeos.core.errors import ConfigurationError, DataLossError
from sparkeos.core.protocol import TxnState
from sparkeos.core.txpool import TransactionPool
from sparkeos.testing.inprocess import ID_SCHEMA, id_batch

POOL = TransactionPool("q0", "files")


def ids(path: str) -> list[int]:
    table = read_output(path)
    return sorted(table.column("id").to_pylist()) if table.num_rows else []


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_prepare_is_invisible_commit_is_idempotent(tmp_path, fmt):
    sink = FileSink(str(tmp_path), format=fmt)
    txn = POOL.transaction(0, 0, "a")
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
    assert not os.listdir(tmp_path / STAGING_DIR)


def test_rollback_removes_every_attempt(tmp_path):
    sink = FileSink(str(tmp_path))
    txn = POOL.transaction(2, 1, "a")
    for attempt in ("a", "b"):
        h = sink.begin(POOL.transaction(2, 1, attempt))
        sink.write(h, id_batch([7]))
        sink.prepare(h)
    sink.rollback(txn)
    sink.rollback(txn)  # idempotent, and fine for IDs never used
    sink.rollback(POOL.transaction(9, 9))
    assert sink.probe(txn) is TxnState.ABSENT and ids(str(tmp_path)) == []


def test_only_the_decided_attempt_is_committed(tmp_path):
    sink = FileSink(str(tmp_path))
    zombie = sink.begin(POOL.transaction(0, 0, "zombie"))
    sink.write(zombie, id_batch([99]))
    winner_txn = POOL.transaction(0, 0, "winner")
    winner = sink.begin(winner_txn)
    sink.write(winner, id_batch([1]))
    receipt = sink.prepare(winner)
    sink.prepare(zombie)
    sink.commit(winner_txn, receipt)
    assert ids(str(tmp_path)) == [1]


def test_empty_partition_commits_nothing(tmp_path):
    sink = FileSink(str(tmp_path))
    txn = POOL.transaction(0, 0, "a")
    receipt = sink.prepare(sink.begin(txn))
    sink.commit(txn, receipt)
    assert committed_files(str(tmp_path)) == []


def test_vanished_staging_of_a_decided_transaction_is_data_loss(tmp_path):
    sink = FileSink(str(tmp_path))
    txn = POOL.transaction(4, 0, "a")
    handle = sink.begin(txn)
    sink.write(handle, id_batch([1]))
    receipt = sink.prepare(handle)
    sink.rollback(txn)  # someone deleted the hidden staging directory
    with pytest.raises(DataLossError, match="batch=4") as info:
        sink.commit(txn, receipt)
    assert "What to do" in str(info.value)


def test_validate_refuses_an_unwritable_directory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigurationError, match="not writable"):
        FileSink(str(blocker / "out")).validate(ID_SCHEMA)


def test_config_is_validated_at_construction():
    with pytest.raises(ConfigurationError, match="needs a path"):
        FileSink("")
    with pytest.raises(ConfigurationError, match="is a URI"):
        FileSink("s3://bucket/out")
    assert FileSink("/tmp/x").describe() == {"path": "/tmp/x", "format": "parquet",
                                             "compression": "snappy", "fsync": True}
