"""The file-system layer and the commit log on Google Cloud Storage and Azure Blob
Storage (their local emulators, fake-gcs-server and Azurite): the ``Files`` contract,
races, lost replies settled by the writer token, a store ignoring its preconditions
refused, and large objects in parts. S3's own cases: test_s3_files.py."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import pytest

from integration.core.test_s3_files import race
from integration.fixtures.clouds import CloudStore
from sparkeos.core.errors import ConfigurationError, RetriableError
from sparkeos.core.storage.logstores import FilesStore, open_store
from sparkeos.core.storage.registry import split_uri
from sparkeos.core.storage.stores.azure import AzureBlobFiles
from sparkeos.core.storage.stores.gcs import GcsFiles
from sparkeos.core.storage.stores.writeonce import ObjectStoreFiles
from sparkeos.testing.files_contract import check_write_once
from sparkeos.testing.wireproxy import LOST_REPLY, SLOW_DOWN, STRIP_CONDITIONS, Fault, FaultProxy

pytestmark = pytest.mark.clouds


@pytest.fixture
def base(cloud: CloudStore, request: Any) -> Iterator[str]:
    uri = cloud.fresh_dir(request.node.name)
    yield uri
    cloud.delete(uri)


def through(files: ObjectStoreFiles, proxy: FaultProxy) -> ObjectStoreFiles:
    """The same bucket, every request through ``proxy``."""
    if isinstance(files, AzureBlobFiles):
        account = files.endpoint.rsplit("/", 1)[-1]
        return dataclasses.replace(files, endpoint=f"{proxy.endpoint}/{account}")
    return dataclasses.replace(files, endpoint=proxy.endpoint)


@pytest.fixture
def proxied(cloud: CloudStore, base: str) -> Iterator[tuple[FaultProxy, ObjectStoreFiles, str]]:
    files, root = split_uri(base)
    assert isinstance(files, ObjectStoreFiles)
    upstream = files.endpoint.rsplit("/", 1)[0] if isinstance(files, AzureBlobFiles) \
        else files.endpoint
    assert upstream
    with FaultProxy(upstream) as proxy:
        yield proxy, through(files, proxy), root


def test_create_claim_and_publish_never_overwrite(cloud: CloudStore, base: str) -> None:
    files, root = split_uri(base)
    assert isinstance(files, GcsFiles if cloud.name == "gcs" else AzureBlobFiles)
    assert files.uri(root) == base and files.atomic_create and not files.is_local
    staging, _ = check_write_once(files, root)
    assert sorted(files.listdir(staging)) == [".claim", "a", "zombie"]  # copied: kept
    assert sorted(files.listdir(root)) == ["part-0", "staging"]
    files.replace(f"{staging}/zombie", f"{root}/meta")
    assert files.read(f"{root}/meta") == b"zombie" and not files.exists(f"{staging}/zombie")
    files.delete(staging)
    assert files.listdir(root) == ["meta", "part-0"] and not files.isdir(staging)


def test_of_racing_writers_exactly_one_wins(base: str) -> None:
    files, root = split_uri(base)
    for round_ in range(4):
        key = f"{root}/record-{round_}"
        winners = race(6, lambda i, key=key: files.create_new(key, f"writer-{i}".encode()))
        assert len(winners) == 1, (round_, winners)
        assert files.read(key) == f"writer-{winners[0]}".encode()
        staged, final = f"{root}/staged-{round_}", f"{root}/out/part-{round_}"
        files.create_new(staged, b"x" * 10_000)
        published = race(4, lambda _i, s=staged, f=final: files.publish(s, f))
        assert len(published) == 1, (round_, published)


def test_commit_log_records_are_write_once(base: str) -> None:
    store = open_store(f"{base}/ckpt/sparkeos/s")
    assert isinstance(store, FilesStore)
    name = "00000000000000000000.outcome.0.json"
    winners = race(4, lambda i: store.write_new(name, f"writer-{i}".encode()))
    assert len(winners) == 1, winners
    store.replace("lease.json", b"1")
    store.replace("lease.json", b"2")
    assert store.read("lease.json") == b"2"
    assert sorted(store.list_names()) == [name, "lease.json"]  # no temporary, no probe


def test_a_lost_reply_to_a_conditional_create_is_its_own_success(proxied: Any) -> None:
    """Issue 37, item 1 on GCS and Azure: the client's retry meets the object its lost
    reply made (412 / 409): the token read back says it is this write's."""
    proxy, files, root = proxied
    files.create_new(f"{root}/before", b"")  # the probe, outside the faults
    # (GCS names the object in an upload's body, not its path: the next conditional
    # request is the one hurt)
    proxy.add(Fault(LOST_REPLY, conditional=True))
    files.create_new(f"{root}/record", b"mine")
    proxy.add(Fault(LOST_REPLY, conditional=True))
    assert files.claim_dir(f"{root}/staging")
    assert len(proxy.injected) == 2, proxy.injected
    assert files.read(f"{root}/record") == b"mine"
    with pytest.raises(FileExistsError):  # another writer is still refused
        files.create_new(f"{root}/record", b"theirs")
    assert not files.claim_dir(f"{root}/staging")


def test_a_publish_whose_reply_is_lost_is_published_once(proxied: Any) -> None:
    proxy, files, root = proxied
    files.create_new(f"{root}/staged", b"data")
    proxy.add(Fault(LOST_REPLY, conditional=True))
    proxy.add(Fault(SLOW_DOWN, conditional=True))
    files.publish(f"{root}/staged", f"{root}/final")
    assert [a for a, _, _ in proxy.injected] == [LOST_REPLY, SLOW_DOWN]
    assert files.read(f"{root}/final") == b"data"
    with pytest.raises(FileExistsError):
        files.publish(f"{root}/staged", f"{root}/final")


def test_a_store_that_ignores_preconditions_is_refused_before_anything_is_written(
        proxied: Any) -> None:
    proxy, files, root = proxied
    proxy.add(Fault(STRIP_CONDITIONS, conditional=True, times=None))
    with pytest.raises(ConfigurationError, match="does not honour conditional writes"):
        files.create_new(f"{root}/record", b"x")
    with pytest.raises(ConfigurationError, match="does not honour conditional writes"):
        files.claim_dir(f"{root}/staging")
    assert [n for n in files.listdir(root) if not n.startswith(".sparkeos-probe")] == []


def test_large_objects_are_uploaded_in_parts_and_published(proxied: Any, tmp_path: Any
                                                           ) -> None:
    """Above the threshold an object goes up in parts (GCS: a resumable upload in
    chunks; Azure: blocks, the block list committed conditionally)."""
    proxy, files, root = proxied
    files = dataclasses.replace(files, multipart_threshold=1024 * 1024,
                                part_size=1024 * 1024)
    data = os.urandom(3 * 1024 * 1024 + 17)
    local = tmp_path / "part.parquet"
    local.write_bytes(data)
    files.upload_new(str(local), f"{root}/staged/part")
    with pytest.raises(FileExistsError):
        files.upload_new(str(local), f"{root}/staged/part")
    files.publish(f"{root}/staged/part", f"{root}/out/part")
    assert files.read(f"{root}/out/part") == data
    parts = [p for m, p in proxy.requests if (m == "PUT" and "comp=block&" in p)
             or "upload_id=" in p or "uploadType=resumable" in p]
    assert len(parts) >= 3, proxy.requests


def test_an_unreachable_store_is_retriable_and_a_missing_bucket_names_the_fix(
        cloud: CloudStore, base: str) -> None:
    files, _ = split_uri(base)
    assert isinstance(files, ObjectStoreFiles)
    dead = "http://127.0.0.1:9" + ("/devstoreaccount1" if cloud.name == "azure" else "")
    impatient = {"retries": 1} if cloud.name == "azure" else {"retry_s": 1.0}
    with pytest.raises(RetriableError):
        dataclasses.replace(files, endpoint=dead, **impatient).exists("/x")
    field = "container" if cloud.name == "azure" else "bucket"
    missing = dataclasses.replace(files, **{field: "no-such-bucket"})
    with pytest.raises(ConfigurationError, match="no-such-bucket does not exist"):
        missing.create_new("/x", b"")
