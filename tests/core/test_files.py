"""The file-system layer's three promises on POSIX paths (HDFS: integration/core)."""

from __future__ import annotations

import os

import pytest

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.files import LocalFiles, WebHdfsFiles, split_uri


def test_local_paths_and_file_uris_are_posix(tmp_path):
    files, path = split_uri(f"file://{tmp_path}/out")
    assert isinstance(files, LocalFiles) and path == f"{tmp_path}/out"
    assert split_uri("relative/dir")[1] == os.path.abspath("relative/dir")


def test_hdfs_uris_go_through_webhdfs(monkeypatch):
    monkeypatch.delenv("SPARKEOS_WEBHDFS_PORT", raising=False)
    files, path = split_uri("hdfs://nn:8020/data/out/")
    assert isinstance(files, WebHdfsFiles)
    assert (files.http, path, files.uri(path)) == ("http://nn:9870", "/data/out",
                                                   "hdfs://nn:8020/data/out")
    monkeypatch.setenv("SPARKEOS_WEBHDFS_PORT", "50070")
    assert split_uri("hdfs://nn:8020/x")[0].http == "http://nn:50070"  # type: ignore[attr-defined]
    assert split_uri("webhdfs://nn:14000/x")[0].http == "http://nn:14000"  # type: ignore[attr-defined]


@pytest.mark.parametrize("uri", ["s3://b/out", "s3a://b/out", "gs://b/out", "abfss://c@a/out"])
def test_object_stores_are_refused_with_the_reason(uri):
    with pytest.raises(ConfigurationError, match="overwrites"):
        split_uri(uri)


def test_local_create_claim_and_publish_never_overwrite(tmp_path):
    files = LocalFiles()
    staged, final = f"{tmp_path}/s/a", f"{tmp_path}/final"
    assert files.claim_dir(f"{tmp_path}/s") and not files.claim_dir(f"{tmp_path}/s")
    files.create_new(staged, b"first")
    with pytest.raises(FileExistsError):
        files.create_new(staged, b"second")
    files.publish(staged, final)
    files.create_new(f"{tmp_path}/s/zombie", b"zombie")
    with pytest.raises(FileExistsError):
        files.publish(f"{tmp_path}/s/zombie", final)
    with pytest.raises(FileNotFoundError):
        files.publish(f"{tmp_path}/s/missing", f"{tmp_path}/other")
    assert files.read(final) == b"first"
    assert sorted(files.listdir(f"{tmp_path}/s")) == ["a", "zombie"]
    files.delete(f"{tmp_path}/s")
    assert files.listdir(f"{tmp_path}/s") == [] and files.exists(final)


def test_the_shared_path_check_passes_and_cleans_up_where_all_see_one_directory(tmp_path):
    from sparkeos.core.fsutil import require_shared_on_executors

    def in_this_process(fn, items):
        return [fn(i) for i in items]

    require_shared_on_executors(in_this_process, [str(tmp_path / "stage")], 4, "s")
    assert os.listdir(tmp_path / "stage") == []


def test_the_shared_path_check_names_the_path_an_executor_does_not_see(tmp_path):
    from sparkeos.core.fsutil import require_shared_on_executors

    def elsewhere(fn, items):  # executors that see another directory at the same path
        return [("executor-host", list(fn.paths)) for _ in items]

    with pytest.raises(ConfigurationError, match=r"stage is not shared.*on host executor-host"):
        require_shared_on_executors(elsewhere, [str(tmp_path / "stage")], 2, "s")
    assert os.listdir(tmp_path / "stage") == []  # the driver's probe is gone again
