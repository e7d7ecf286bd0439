"""The file-system layer and the commit log on a real HDFS (WebHDFS from Python)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sparkeos.core.errors import RecordExistsError, RetriableError
from sparkeos.core.storage.logstores import FilesStore, open_store
from sparkeos.core.storage.registry import split_uri
from sparkeos.testing.files_contract import check_write_once

pytestmark = pytest.mark.hdfs


@pytest.fixture
def base(hdfs: Any, request: Any) -> Any:
    uri = hdfs.fresh_dir(request.node.name)
    yield uri
    hdfs.delete(uri)


def test_create_claim_and_publish_never_overwrite(base: str) -> None:
    files, root = split_uri(base)
    staging, _final = check_write_once(files, root)
    assert sorted(files.listdir(staging)) == [".claim", "zombie"]  # renamed: moved
    files.create_new(f"{root}/empty", b"")
    assert files.read(f"{root}/empty") == b""


def test_commit_log_records_are_write_once_under_a_race(base: str) -> None:
    store = open_store(f"{base}/ckpt/sparkeos/s")
    assert isinstance(store, FilesStore)
    outcomes: list[str] = []

    def write(tag: str) -> None:
        try:
            store.write_new("00000000000000000000.outcome.0.json", tag.encode())
            outcomes.append(tag)
        except RecordExistsError:
            outcomes.append("refused")

    threads = [threading.Thread(target=write, args=(f"writer-{i}",)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [o for o in outcomes if o != "refused"]
    assert len(winners) == 1, outcomes
    assert store.read("00000000000000000000.outcome.0.json") == winners[0].encode()
    assert store.list_names() == ["00000000000000000000.outcome.0.json"]  # no temp left
    store.replace("lease.json", b"1")
    store.replace("lease.json", b"2")
    assert store.read("lease.json") == b"2"


def test_an_unreachable_namenode_is_a_retriable_error_naming_the_fix() -> None:
    files, path = split_uri("webhdfs://127.0.0.1:9/x")
    with pytest.raises(RetriableError, match="cannot be reached") as info:
        files.exists(path)
    assert "SPARKEOS_WEBHDFS_PORT" in str(info.value)
