from __future__ import annotations

import os

import pytest

from sparkeos.core.errors import CommitLogError, RecordExistsError
from sparkeos.core.snapshot.commitlog import (
    ABORTED,
    BEGUN,
    DECIDED,
    FINISHED,
    OUTCOME,
    CommitLog,
    record_name,
    sink_log_location,
)
from sparkeos.core.storage.logstores import LocalStore, open_store


def test_records_round_trip_and_define_state(tmp_path):
    log = CommitLog(LocalStore(str(tmp_path)))
    log.append(3, BEGUN, {"partitions": 2, "slot": 1}, run=0)
    assert log.batches()[3].status == "begun" and log.batches()[3].needs_rollback
    log.append(3, OUTCOME, {"outcome": ABORTED}, run=0)
    assert log.batches()[3].status == "aborted" and not log.batches()[3].unresolved
    log.append(3, BEGUN, {"partitions": 3, "slot": 1}, run=1)
    assert log.batches()[3].open_runs == [1]
    log.append(3, OUTCOME, {"outcome": DECIDED, "participants": []}, run=1)
    assert log.batches()[3].needs_commit and log.batches()[3].decided_run == 1
    log.append(3, FINISHED, {})
    state = log.batches()[3]
    assert state.status == "finished" and not state.unresolved
    assert state.begun[0]["partitions"] == 2 and state.aborted == {0}


def test_records_are_write_once(tmp_path):
    log = CommitLog(LocalStore(str(tmp_path)))
    log.append(1, FINISHED, {})
    with pytest.raises(RecordExistsError, match="already exists"):
        log.append(1, FINISHED, {})


def test_one_outcome_per_run_first_writer_wins(tmp_path):
    """Invariant 10: a racing `sparkeos recover` and a live driver cannot both record
    an outcome for the same run; the loser reads the winner's."""
    log = CommitLog(LocalStore(str(tmp_path)))
    log.append(2, BEGUN, {"partitions": 1}, run=0)
    held = log.claim(2, OUTCOME, {"outcome": ABORTED, "reason": "recovery"}, run=0)
    assert held["outcome"] == ABORTED
    again = log.claim(2, OUTCOME, {"outcome": DECIDED, "participants": []}, run=0)
    assert again["outcome"] == ABORTED and again["reason"] == "recovery"
    assert log.batches()[2].decided is None


def test_lease_round_trip(tmp_path):
    log = CommitLog(LocalStore(str(tmp_path)))
    assert log.read_lease() is None
    log.write_lease({"pid": 1, "renewed": 2.0})
    log.write_lease({"pid": 1, "renewed": 3.0})
    assert log.read_lease() == {"pid": 1, "renewed": 3.0}


def test_no_temporary_files_are_left(tmp_path):
    log = CommitLog(LocalStore(str(tmp_path)))
    log.append(1, BEGUN, {"partitions": 1}, run=0)
    log.write_meta({"a": 1})
    assert sorted(os.listdir(tmp_path)) == [record_name(1, BEGUN, 0), "sink.json"]


def test_corrupt_record_is_a_clear_error(tmp_path):
    log = CommitLog(LocalStore(str(tmp_path)))
    (tmp_path / record_name(5, OUTCOME, 0)).write_text("{not json")
    with pytest.raises(CommitLogError, match="not valid JSON"):
        log.batches()


def test_file_uri_and_location_layout(tmp_path):
    location = sink_log_location(f"file://{tmp_path}/ckpt/", "orders")
    store = open_store(location)
    assert isinstance(store, LocalStore)
    assert store.directory == f"{tmp_path}/ckpt/sparkeos/orders"


def test_remote_uri_without_spark_is_refused():
    with pytest.raises(CommitLogError, match="only through Spark's JVM"):
        open_store("viewfs://cluster/ckpt/sparkeos/x")


@pytest.mark.parametrize("uri", ["oss://bucket/ckpt", "r2://bucket/ckpt"])
def test_an_object_store_without_conditional_writes_is_refused_for_the_commit_log(uri):
    """Through Hadoop its write-once records would be a check followed by a copy: two
    claimers of one outcome could both win. Refused with or without a Spark session."""
    with pytest.raises(CommitLogError, match="object store") as info:
        open_store(f"{uri}/sparkeos/x", spark=object())
    assert "HDFS" in str(info.value) and "s3a://" in str(info.value)


@pytest.mark.parametrize("scheme", ["s3", "s3a", "gs", "abfss"])
def test_an_object_store_commit_log_is_written_from_python_with_conditional_writes(scheme):
    from sparkeos.core.storage.logstores import FilesStore

    bucket = "c@account.dfs.core.windows.net" if scheme == "abfss" else "bucket"
    assert isinstance(open_store(f"{scheme}://{bucket}/ckpt/sparkeos/x", spark=object()),
                      FilesStore)


def test_hdfs_without_spark_is_reached_from_python():
    from sparkeos.core.storage.logstores import FilesStore

    assert isinstance(open_store("hdfs://nn:8020/ckpt/sparkeos/x"), FilesStore)
    assert isinstance(open_store("webhdfs://nn:9870/ckpt/sparkeos/x"), FilesStore)
