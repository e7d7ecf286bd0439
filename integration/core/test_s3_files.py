"""The file-system layer and the commit log on a real S3-compatible store (conditional
writes from Python), and the refusal of a store that ignores them."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from integration.fixtures.s3 import S3
from sparkeos.core.errors import ConfigurationError, RecordExistsError, RetriableError
from sparkeos.core.storage.logstores import FilesStore, open_store
from sparkeos.core.storage.registry import split_uri
from sparkeos.core.storage.stores import s3 as s3_store
from sparkeos.core.storage.stores import settings, writeonce
from sparkeos.core.storage.stores.s3 import S3Files
from sparkeos.testing.files_contract import check_write_once
from sparkeos.testing.s3a import make_bucket
from sparkeos.testing.wireproxy import (
    LOST_REPLY,
    RESET,
    SLOW_DOWN,
    STRIP_CONDITIONS,
    Fault,
    FaultProxy,
)

pytestmark = pytest.mark.s3


@pytest.fixture
def base(s3: S3, request: Any) -> Iterator[str]:
    uri = s3.fresh_dir(request.node.name)
    yield uri
    s3.delete(uri)


def race(n: int, attempt: Callable[[int], None]) -> list[int]:
    """Run ``attempt(i)`` for i in 0..n-1 on n threads released at once; the winners
    (the calls that raised no ``FileExistsError`` / ``RecordExistsError``)."""
    gate, winners = threading.Barrier(n), []

    def run(i: int) -> None:
        gate.wait()
        try:
            attempt(i)
        except (FileExistsError, RecordExistsError):
            return
        winners.append(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return winners


def test_create_claim_and_publish_never_overwrite(base: str) -> None:
    files, root = split_uri(base)
    assert isinstance(files, S3Files) and files.uri(root) == base
    staging, final = check_write_once(files, root)
    assert sorted(files.listdir(staging)) == [".claim", "a", "zombie"]  # copied: kept
    assert sorted(files.listdir(root)) == ["part-0", "staging"]
    assert files.exists(staging) and files.exists(final)
    assert not files.exists(f"{root}/part-1")
    files.replace(f"{staging}/zombie", f"{root}/meta")
    assert files.read(f"{root}/meta") == b"zombie" and not files.exists(f"{staging}/zombie")
    files.delete(staging)
    assert files.listdir(root) == ["meta", "part-0"] and not files.isdir(staging)
    with pytest.raises(FileNotFoundError):
        files.read(f"{staging}/a")


def test_of_racing_writers_exactly_one_wins_and_the_others_read_its_data(base: str) -> None:
    files, root = split_uri(base)
    for round_ in range(12):
        key = f"{root}/record-{round_}"
        winners = race(8, lambda i, key=key: files.create_new(key, f"writer-{i}".encode()))
        assert len(winners) == 1, (round_, winners)
        assert files.read(key) == f"writer-{winners[0]}".encode()
        claimed = race(8, lambda i, r=round_: (
            None if files.claim_dir(f"{root}/claim-{r}") else files.create_new(
                f"{root}/claim-{r}/.claim", b"")))
        assert len(claimed) == 1, (round_, claimed)


def test_twin_publishers_of_one_staged_object_publish_it_once(base: str) -> None:
    files, root = split_uri(base)
    for round_ in range(10):
        staged, final = f"{root}/staging/part-{round_}", f"{root}/out/part-{round_}"
        files.create_new(staged, b"x" * 100_000 + str(round_).encode())
        winners = race(4, lambda _i, s=staged, f=final: files.publish(s, f))
        assert len(winners) == 1, (round_, winners)
        assert files.read(final) == b"x" * 100_000 + str(round_).encode()
    assert len(files.listdir(f"{root}/out")) == 10


def test_commit_log_records_are_write_once_under_a_race(base: str) -> None:
    store = open_store(f"{base}/ckpt/sparkeos/s")
    assert isinstance(store, FilesStore)
    name = "00000000000000000000.outcome.0.json"
    winners = race(6, lambda i: store.write_new(name, f"writer-{i}".encode()))
    assert len(winners) == 1, winners
    assert store.read(name) == f"writer-{winners[0]}".encode()
    assert store.list_names() == [name]  # no temporary name, no probe left
    store.replace("lease.json", b"1")
    store.replace("lease.json", b"2")
    assert store.read("lease.json") == b"2"
    assert sorted(store.list_names()) == [name, "lease.json"]


def test_listings_and_deletes_read_every_page(base: str) -> None:
    """S3 answers at most 1000 keys per listing: a sweep must read every page (here
    pages of 10, so 45 keys make five)."""
    files, root = split_uri(base)
    assert isinstance(files, S3Files)
    files = dataclasses.replace(files, page_size=10)
    names = {f"f{i:02d}" for i in range(40)} | {f"d{i}" for i in range(5)}
    for name in names:
        files.create_new(f"{root}/many/{name}" + ("/x" if name.startswith("d") else ""), b"")
    assert set(files.listdir(f"{root}/many")) == names
    files.delete(f"{root}/many")
    assert files.listdir(f"{root}/many") == []


def test_a_store_that_ignores_conditional_writes_is_refused_before_anything_is_written(
        s3_without_conditional_writes: S3) -> None:
    weak = s3_without_conditional_writes
    files = S3Files("s3a", weak.bucket, weak.endpoint)
    with pytest.raises(ConfigurationError, match="does not honour conditional writes"):
        files.create_new("/ckpt/record", b"x")
    with pytest.raises(ConfigurationError, match="does not honour conditional writes"):
        files.claim_dir("/ckpt/staging")
    assert files.listdir("/ckpt") == [], "the refused store was written to"


def test_an_unreachable_store_is_a_retriable_error_and_a_missing_bucket_names_the_fix(
        s3: S3) -> None:
    with pytest.raises(RetriableError, match="cannot be reached"):
        S3Files("s3a", "any", "http://127.0.0.1:9").exists("/x")
    with pytest.raises(ConfigurationError, match="bucket no-such-bucket does not exist"):
        S3Files("s3a", "no-such-bucket", s3.endpoint).create_new("/x", b"")


# -- a bad network day: replies lost after the store applied the request ---------------------
@pytest.fixture
def proxied(s3: S3, base: str, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[tuple[FaultProxy, S3Files, str]]:
    """The test's prefix reached through a fault-injecting proxy: the endpoint every
    store this process opens meanwhile finds (``AWS_ENDPOINT_URL_S3``)."""
    with FaultProxy(s3.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        files, root = split_uri(base)
        assert isinstance(files, S3Files) and files.endpoint == proxy.endpoint
        yield proxy, files, root


def lose_reply(proxy: FaultProxy, name: str, times: int = 1) -> Fault:
    """The store applies the next conditional PUT of a key ending in ``name``; its reply
    is lost ``times`` times (botocore sends it again meanwhile)."""
    return proxy.add(Fault(LOST_REPLY, method="PUT", path=f"/{re.escape(name)}$",
                           conditional=True, times=times))


def test_a_lost_reply_to_a_write_once_create_is_its_own_success(proxied: Any) -> None:
    """Issue 37, 1: botocore's retry of a create whose reply was lost gets 412 for its own
    object, which is not another writer's."""
    proxy, files, root = proxied
    lose_reply(proxy, "record")
    files.create_new(f"{root}/record", b"mine")
    assert [a for a, _m, _p in proxy.injected] == [LOST_REPLY]
    assert files.read(f"{root}/record") == b"mine"
    with pytest.raises(FileExistsError):  # another writer still loses
        files.create_new(f"{root}/record", b"theirs")


def test_a_lost_reply_beyond_boto_retries_is_retried_with_the_same_token(proxied: Any
                                                                        ) -> None:
    """Every try of botocore's (3) loses its reply: the write is retried here, as the
    same writer, and succeeds; 503 SlowDown past botocore's tries too."""
    proxy, files, root = proxied
    lose_reply(proxy, "record", times=3)
    files.create_new(f"{root}/record", b"mine")
    assert len(proxy.injected) == 3 and files.read(f"{root}/record") == b"mine"
    proxy.add(Fault(SLOW_DOWN, method="PUT", path="/slow$", times=4))
    files.create_new(f"{root}/slow", b"late")
    assert files.read(f"{root}/slow") == b"late"


def test_a_lost_reply_to_a_claim_or_a_publish_is_not_a_lost_race(proxied: Any) -> None:
    proxy, files, root = proxied
    lose_reply(proxy, ".claim")
    assert files.claim_dir(f"{root}/attempt") is True
    assert files.claim_dir(f"{root}/attempt") is False  # a second claimer loses
    assert not [n for n in files.listdir(f"{root}/attempt") if n.startswith(".sparkeos-probe")]
    files.create_new(f"{root}/staging/part-0", b"rows")
    lose_reply(proxy, "part-0")
    files.publish(f"{root}/staging/part-0", f"{root}/out/part-0")
    assert files.read(f"{root}/out/part-0") == b"rows" and len(proxy.injected) == 2


def test_a_lost_reply_to_a_commit_log_record_is_no_second_driver(proxied: Any) -> None:
    """The ``begun`` record's write-once create and the lease's replacement, each with its
    reply lost: recorded once, no error blaming another driver, no temporary object."""
    proxy, files, root = proxied
    store = FilesStore(files.uri(f"{root}/ckpt/sparkeos/s"))
    name = "00000000000000000001.begun.0.json"
    lose_reply(proxy, name)
    store.write_new(name, b"run 0")
    assert store.read(name) == b"run 0"
    with pytest.raises(RecordExistsError):
        store.write_new(name, b"a second driver")
    proxy.add(Fault(LOST_REPLY, method="PUT", path="/lease.json$"))
    store.replace("lease.json", b"held")
    assert store.read("lease.json") == b"held" and len(proxy.injected) == 2
    assert sorted(files.listdir(f"{root}/ckpt/sparkeos/s")) == [name, "lease.json"]


def test_a_probe_a_dead_process_left_is_removed_by_the_next_probe(s3: S3, base: str,
                                                                 monkeypatch: Any) -> None:
    """Issue 37, 5: a process that died between the probe's writes left it; the next
    process's probe beside it removes it (an hour later), and keeps its own out of the
    directory it claims."""
    direct, root = split_uri(base)
    direct.create_new(f"{root}/.sparkeos-probe-1000-dead", b"probe")
    recent = f".sparkeos-probe-{int(time.time() * 1000)}-alive"
    direct.create_new(f"{root}/{recent}", b"probe")
    with FaultProxy(s3.endpoint) as proxy:  # a new endpoint: this process probes again
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        files, _ = split_uri(base)
        assert files.claim_dir(f"{root}/attempt")
    assert sorted(direct.listdir(root)) == [recent, "attempt"]
    assert direct.listdir(f"{root}/attempt") == [".claim"]


def test_large_objects_are_uploaded_and_published_in_parts(proxied: Any, tmp_path: Any
                                                           ) -> None:
    """Issue 37, 2: above the threshold a staged file goes up in parts (a single PUT
    takes 5 GiB at most) and a publish copies the staged object's ranges inside the
    store; the completion is conditional (never over an existing key) and knows its own
    object when its reply is lost."""
    proxy, files, root = proxied
    files = dataclasses.replace(files, multipart_threshold=6 * 1024 * 1024,
                                part_size=5 * 1024 * 1024)
    local = tmp_path / "part-0"
    data = bytes(range(256)) * (11 * 1024 * 1024 // 256 + 7)  # 11 MiB and a bit: 3 parts
    local.write_bytes(data)
    files.upload_new(str(local), f"{root}/staging/part-0")
    assert files.read(f"{root}/staging/part-0") == data
    with pytest.raises(FileExistsError):
        files.upload_new(str(local), f"{root}/staging/part-0")
    proxy.add(Fault(LOST_REPLY, method="POST", path=r"/out/part-0\?uploadId="))
    seen = len(proxy.requests)
    files.publish(f"{root}/staging/part-0", f"{root}/out/part-0")
    assert [a for a, _m, _p in proxy.injected] == [LOST_REPLY]
    publish = proxy.requests[seen:]
    assert not [p for m, p in publish if m == "GET"], "the publish read the object"
    assert sum(1 for m, p in publish if m == "PUT" and "partNumber=" in p) == 3
    assert files.read(f"{root}/out/part-0") == data
    with pytest.raises(FileExistsError):  # a twin publisher loses, nothing overwritten
        files.publish(f"{root}/staging/part-0", f"{root}/out/part-0")
    client = files._client()
    assert not client.list_multipart_uploads(Bucket=files.bucket,
                                             Prefix=root.lstrip("/")).get("Uploads")


# -- per-bucket settings and whose verdict (issue 48, defect 6) ------------------------------
DOTTED_BUCKET = "sparkeos.dotted"


def test_a_dotted_bucket_is_reached_through_its_own_endpoint_setting(
        s3: S3, monkeypatch: pytest.MonkeyPatch) -> None:
    """The endpoint only in ``spark.hadoop.fs.s3a.bucket.sparkeos.dotted.endpoint``, the
    way a format carries the session's settings (no ``AWS_ENDPOINT_URL_S3``, no generic
    endpoint): a bucket with dots in its name is found at that endpoint, its key written
    once and read back (path-style, as for every custom endpoint)."""
    make_bucket(s3.endpoint, DOTTED_BUCKET)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    session = SimpleNamespace(conf=SimpleNamespace(getAll={
        f"spark.hadoop.fs.s3a.bucket.{DOTTED_BUCKET}.endpoint": s3.endpoint}))
    with settings.using(settings.captured_from(session)):
        files, root = split_uri(f"s3a://{DOTTED_BUCKET}/it/{uuid.uuid4().hex[:8]}")
    assert isinstance(files, S3Files) and files.endpoint == s3.endpoint
    files.create_new(f"{root}/record", b"dotted")
    with pytest.raises(FileExistsError):
        files.create_new(f"{root}/record", b"again")
    assert files.read(f"{root}/record") == b"dotted"
    files.delete(root)


@pytest.fixture
def fragile(s3: S3, base: str, monkeypatch: pytest.MonkeyPatch
            ) -> Iterator[tuple[FaultProxy, S3Files, str]]:
    """The test's prefix through a proxy, with one try per request (botocore's and the
    write-once layer's retries off): a failure reaches the caller at once."""
    monkeypatch.setattr(s3_store, "BOTO_ATTEMPTS", 1)
    monkeypatch.setattr(writeonce, "TRANSIENT_RETRIES", 0)
    with FaultProxy(s3.endpoint) as proxy:
        files, root = split_uri(base)
        assert isinstance(files, S3Files)
        yield proxy, dataclasses.replace(files, endpoint=proxy.endpoint), root


def probes(proxy: FaultProxy) -> int:
    """Conditional writes of probe keys the proxy saw."""
    return sum(1 for method, path in proxy.requests
               if method == "PUT" and writeonce.PROBE_PREFIX in path) // 2


def test_a_store_that_failed_is_probed_again_before_the_next_write(fragile: Any) -> None:
    """A store passes the probe, then fails a write (unreachable for a moment) and comes
    back as one that ignores preconditions (another server behind the endpoint): the
    next write-once call probes again and refuses it, never trusting the old verdict."""
    proxy, files, root = fragile
    files.create_new(f"{root}/first", b"1")
    assert probes(proxy) == 1
    files.create_new(f"{root}/second", b"2")
    assert probes(proxy) == 1  # the verdict is kept while nothing fails
    proxy.add(Fault(RESET, method="PUT", path=r"/third$"))
    with pytest.raises(RetriableError, match="cannot be reached"):
        files.create_new(f"{root}/third", b"3")
    proxy.add(Fault(STRIP_CONDITIONS, times=None))
    with pytest.raises(ConfigurationError, match="does not honour conditional writes"):
        files.create_new(f"{root}/first", b"overwritten")
    assert files.read(f"{root}/first") == b"1"


def test_a_verdict_expires(fragile: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store replaced behind its endpoint without any request failing (botocore
    reconnects by itself) is probed again once ``VERDICT_TTL_S`` passed."""
    proxy, files, root = fragile
    now = [1000.0]
    monkeypatch.setattr(writeonce, "monotonic", lambda: now[0], raising=False)
    files.create_new(f"{root}/first", b"1")
    proxy.add(Fault(STRIP_CONDITIONS, times=None))
    now[0] += writeonce.VERDICT_TTL_S
    with pytest.raises(ConfigurationError, match="does not honour conditional writes"):
        files.create_new(f"{root}/first", b"overwritten")
    assert files.read(f"{root}/first") == b"1"


def test_other_credentials_on_one_endpoint_are_another_store(
        fragile: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another ``AWS_*`` environment (another tenant of one endpoint, as on Ceph RGW) is
    probed on its own and gets a client of its own."""
    proxy, files, root = fragile
    files.create_new(f"{root}/first", b"1")
    client = files._client()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "another-tenant")
    files.create_new(f"{root}/second", b"2")
    assert probes(proxy) == 2 and files._client() is not client
