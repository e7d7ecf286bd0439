from __future__ import annotations

import os

import pytest

from sparkeos.core.commitlog import (
    BEGUN,
    DECIDED,
    FINISHED,
    CommitLog,
    LocalStore,
    open_store,
    record_name,
    sink_log_location,
)
from sparkeos.core.errors import CommitLogError


def test_records_round_trip_and_define_state(tmp_path):
    log = CommitLog(LocalStore(str(tmp_path)))
    log.append(3, BEGUN, {"partitions": 2, "slot": 1}, attempt=0)
    assert log.batches()[3].status == "begun" and log.batches()[3].needs_rollback
    log.append(3, DECIDED, {"participants": []})
    assert log.batches()[3].needs_commit
    log.append(3, FINISHED, {})
    state = log.batches()[3]
    assert state.status == "finished" and not state.unresolved
    assert state.begun[0]["partitions"] == 2


def test_records_are_write_once(tmp_path):
    log = CommitLog(LocalStore(str(tmp_path)))
    log.append(1, DECIDED, {})
    with pytest.raises(CommitLogError, match="already exists"):
        log.append(1, DECIDED, {})


def test_no_temporary_files_are_left(tmp_path):
    log = CommitLog(LocalStore(str(tmp_path)))
    log.append(1, BEGUN, {"partitions": 1}, attempt=0)
    log.write_meta({"a": 1})
    assert sorted(os.listdir(tmp_path)) == [record_name(1, BEGUN, 0), "sink.json"]


def test_corrupt_record_is_a_clear_error(tmp_path):
    log = CommitLog(LocalStore(str(tmp_path)))
    (tmp_path / record_name(5, DECIDED)).write_text("{not json")
    with pytest.raises(CommitLogError, match="not valid JSON"):
        log.batches()


def test_file_uri_and_location_layout(tmp_path):
    location = sink_log_location(f"file://{tmp_path}/ckpt/", "orders")
    store = open_store(location)
    assert isinstance(store, LocalStore)
    assert store.directory == f"{tmp_path}/ckpt/sparkeos/orders"


def test_remote_uri_without_spark_is_refused():
    with pytest.raises(CommitLogError, match="non-local"):
        open_store("s3a://bucket/ckpt/sparkeos/x")
