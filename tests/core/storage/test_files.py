"""The file-system layer's three promises on POSIX paths (HDFS: integration/core)."""

from __future__ import annotations

import os
import pickle

import pytest

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.storage.registry import resolve_location, split_uri
from sparkeos.core.storage.stores.azure import AzureBlobFiles
from sparkeos.core.storage.stores.gcs import GcsFiles
from sparkeos.core.storage.stores.local import LocalFiles
from sparkeos.core.storage.stores.s3 import S3Files
from sparkeos.core.storage.stores.webhdfs import WebHdfsFiles
from sparkeos.testing.files_contract import check_write_once


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


@pytest.mark.parametrize("uri", ["oss://b/out", "r2://b/out"])
def test_object_stores_without_conditional_writes_from_sparkeos_are_refused(uri):
    with pytest.raises(ConfigurationError, match="conditional writes"):
        split_uri(uri)


def test_gs_uris_are_written_with_conditional_writes(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    files, path = split_uri("gs://bucket/data/out/")
    assert isinstance(files, GcsFiles) and files.atomic_create and not files.is_local
    assert (files.bucket, files.endpoint, path) == ("bucket", "http://127.0.0.1:4443",
                                                    "/data/out")
    assert resolve_location("gs://bucket/data/out/") == "gs://bucket/data/out"
    with pytest.raises(ConfigurationError, match="names no bucket"):
        split_uri("gs:///data")


ACCOUNT_KEY = "a2V5LWNhbmFyeQ=="


@pytest.mark.parametrize("scheme,host", [("abfss", "acct.dfs.core.windows.net"),
                                         ("wasbs", "acct.blob.core.windows.net")])
def test_azure_uris_name_a_container_of_an_account(scheme, host, monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.setenv("AZURE_STORAGE_KEY", ACCOUNT_KEY)
    files, path = split_uri(f"{scheme}://data@{host}/out/")
    assert isinstance(files, AzureBlobFiles) and files.atomic_create
    assert (files.container, files.account, files.endpoint, path) == (
        "data", "acct", "https://acct.blob.core.windows.net", "/out")
    assert files.uri(path) == f"{scheme}://data@{host}/out"
    assert ACCOUNT_KEY not in repr(files) + repr(pickle.dumps(files))  # never carried
    with pytest.raises(ConfigurationError, match="names no container"):
        split_uri(f"{scheme}://{host}/out")


def test_an_azure_connection_string_gives_its_account_s_endpoint(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
                       f"AccountKey={ACCOUNT_KEY};BlobEndpoint=http://127.0.0.1:10000/"
                       "devstoreaccount1;")
    emulated, _ = split_uri("abfs://c@devstoreaccount1.dfs.core.windows.net/x")
    assert emulated.endpoint == "http://127.0.0.1:10000/devstoreaccount1"  # type: ignore[attr-defined]
    other, _ = split_uri("abfs://c@other.dfs.core.windows.net/x")
    assert other.endpoint == "https://other.blob.core.windows.net"  # type: ignore[attr-defined]


@pytest.mark.parametrize("scheme", ["s3", "s3a", "s3n"])
def test_s3_uris_are_written_with_conditional_writes(scheme, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000/")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cret-canary")
    files, path = split_uri(f"{scheme}://bucket/data/out/")
    assert isinstance(files, S3Files) and files.atomic_create and not files.is_local
    assert (files.bucket, files.endpoint, files.region, path) == (
        "bucket", "http://127.0.0.1:9000", "eu-west-1", "/data/out")
    assert files.uri(path) == f"{scheme}://bucket/data/out"
    assert resolve_location(f"{scheme}://bucket/data/out/") == f"{scheme}://bucket/data/out"
    assert "s3cret-canary" not in repr(files) + repr(pickle.dumps(files))  # never carried
    with pytest.raises(ConfigurationError, match="names no bucket"):
        split_uri(f"{scheme}:///data")


def test_local_create_claim_and_publish_never_overwrite(tmp_path):
    files = LocalFiles()
    staging, final = check_write_once(files, str(tmp_path))
    assert sorted(files.listdir(staging)) == ["a", "zombie"]  # linked, not moved
    files.delete(staging)
    assert files.listdir(staging) == [] and files.exists(final)


def test_the_shared_path_check_passes_and_cleans_up_where_all_see_one_directory(tmp_path):
    from sparkeos.core.storage.fsutil import require_shared_on_executors

    def in_this_process(fn, items):
        return [fn(i) for i in items]

    require_shared_on_executors(in_this_process, [str(tmp_path / "stage")], 4, "s")
    assert os.listdir(tmp_path / "stage") == []


def test_the_shared_path_check_names_the_path_an_executor_does_not_see(tmp_path):
    from sparkeos.core.storage.fsutil import require_shared_on_executors

    def elsewhere(fn, items):  # executors that see another directory at the same path
        return [("executor-host", list(fn.paths)) for _ in items]

    with pytest.raises(ConfigurationError, match=r"stage is not shared.*on host executor-host"):
        require_shared_on_executors(elsewhere, [str(tmp_path / "stage")], 2, "s")
    assert os.listdir(tmp_path / "stage") == []  # the driver's probe is gone again
