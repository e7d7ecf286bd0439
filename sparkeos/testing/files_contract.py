"""The three promises every ``core.storage.files.Files`` keeps (write-once creation, exclusive
claim, publish without overwrite), as one check a test of each file system runs
against a real one: POSIX (tests/core), HDFS and object stores (integration/core)."""

from __future__ import annotations

import pytest

from sparkeos.core.storage.files import Files


def check_write_once(files: Files, root: str) -> tuple[str, str]:
    """Claim ``<root>/staging``, create, publish to ``<root>/part-0`` and try every way
    to overwrite; returns ``(staging, final)`` for the caller's own checks (the staging
    directory holds the published ``a`` (or not: a move) and a ``zombie``)."""
    staging, final = f"{root}/staging", f"{root}/part-0"
    assert files.claim_dir(staging)
    assert not files.claim_dir(staging), "a second claim of one directory succeeded"
    files.create_new(f"{staging}/a", b"first")
    with pytest.raises(FileExistsError):
        files.create_new(f"{staging}/a", b"second")
    files.publish(f"{staging}/a", final)
    files.create_new(f"{staging}/zombie", b"zombie")
    with pytest.raises(FileExistsError):
        files.publish(f"{staging}/zombie", final)
    with pytest.raises(FileNotFoundError):
        files.publish(f"{staging}/missing", f"{root}/part-1")
    assert files.read(final) == b"first"
    assert files.read(f"{staging}/zombie") == b"zombie"
    assert files.isdir(staging) and not files.isdir(final)
    return staging, final
