"""The file-system layer and the commit log on a real S3-compatible store (conditional
writes from Python), and the refusal of a store that ignores them."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from integration.fixtures.s3 import S3
from sparkeos.core.commitlog import FilesStore, open_store
from sparkeos.core.errors import ConfigurationError, RecordExistsError, RetriableError
from sparkeos.core.files import split_uri
from sparkeos.core.objectstore import S3Files
from sparkeos.testing.files_contract import check_write_once

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
