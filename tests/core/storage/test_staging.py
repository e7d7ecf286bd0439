"""StagingArea: the per-attempt staging directories of Kafka- and STOMP-like sinks."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from sparkeos.core.errors import (
    AttemptFencedError,
    ConfigurationError,
    DataLossError,
    RetriableError,
)
from sparkeos.core.snapshot.txpool import AttemptRange, TransactionPool
from sparkeos.core.storage.staging import StagingArea, default_dir

MARKS: dict[str, Any] = {}


def area(tmp_path: Any, prefix: str = "") -> StagingArea:
    staging = StagingArea(str(tmp_path / "staging"), prefix=prefix)
    MARKS[staging.root] = staging.check_on_driver()
    return staging


def claim(staging: StagingArea, txn: Any) -> str:
    return staging.claim(txn, MARKS.get(staging.root))


def test_an_attempt_claims_its_directory_once(tmp_path: Any) -> None:
    staging = area(tmp_path, "t-")
    txn = TransactionPool("q1", "s").transaction(0, 0, 0, 0)
    directory = claim(staging, txn)
    assert os.path.basename(directory) == "t-" + txn.txn_id
    with pytest.raises(AttemptFencedError):
        claim(staging, txn)


def test_a_directory_the_driver_did_not_mark_is_refused(tmp_path: Any) -> None:
    driver_mark = StagingArea(str(tmp_path / "driver")).check_on_driver()
    staging = StagingArea(str(tmp_path / "elsewhere"))
    os.makedirs(staging.root)
    with pytest.raises(ConfigurationError, match="not shared"):
        staging.claim(TransactionPool("q1", "s").transaction(0, 0, 0, 0), driver_mark)
    with pytest.raises(ConfigurationError, match="validate"):  # never marked at all
        staging.claim(TransactionPool("q1", "s").transaction(0, 0, 0, 0), None)


def test_the_sweep_keeps_the_decided_and_what_it_does_not_cover(tmp_path: Any) -> None:
    staging = area(tmp_path, "t-")
    pool = TransactionPool("q1", "s")
    decided, loser, later = (pool.transaction(0, 0, 0, 0), pool.transaction(0, 0, 0, 1),
                             pool.transaction(2, 0, 0, 0))
    other = TransactionPool("q2", "s").transaction(0, 0, 0, 1)
    for txn in (decided, loser, later, other):
        claim(staging, txn)
    staging.sweep([AttemptRange("q1", "s", 0, 0, 1, 2)], frozenset({decided.txn_id}))
    left = sorted(os.listdir(staging.root))
    assert "t-" + loser.txn_id not in left
    assert {"t-" + t.txn_id for t in (decided, later, other)} <= set(left)


def test_a_staged_file_is_found_or_explained(tmp_path: Any) -> None:
    staging = area(tmp_path)
    txn = TransactionPool("q1", "s").transaction(0, 0, 0, 0)
    directory = claim(staging, txn)
    path = staging.writable_file(directory, "records.arrow")
    assert path == os.path.join(directory, "records.arrow")  # in place on POSIX
    with open(path, "wb") as fh:
        fh.write(b"x")
    receipt = {"file": staging.seal(directory, "records.arrow", path, fsync=True),
               "host": socket.gethostname()}
    assert staging.staged_file(txn, receipt, txn.txn_id) == path
    staging.delete(txn)
    assert staging.staged_file(txn, receipt, txn.txn_id) is None  # the caller decides
    with pytest.raises(RetriableError, match="written on host elsewhere"):
        staging.staged_file(txn, {**receipt, "host": "elsewhere"}, txn.txn_id)
    with pytest.raises(DataLossError, match="outside staging_dir"):
        staging.staged_file(txn, {"file": "../../etc/passwd"}, txn.txn_id)


def test_the_default_directory_comes_from_the_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("SPARKEOS_X_DIR", "/tmp/x-staging")
    assert default_dir("SPARKEOS_X_DIR", "x") == "/tmp/x-staging"
    monkeypatch.delenv("SPARKEOS_X_DIR")
    assert default_dir("SPARKEOS_X_DIR", "x").endswith("/.sparkeos/x")


def test_write_atomically_replaces_whole_and_leaves_no_temporary(tmp_path: Any) -> None:
    from sparkeos.core.storage.fsutil import write_atomically

    path = str(tmp_path / "state.json")
    write_atomically(path, b"one")
    write_atomically(path, b"two", fsync=False)
    with open(path, "rb") as fh:
        assert fh.read() == b"two"
    assert os.listdir(tmp_path) == ["state.json"]
