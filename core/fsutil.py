"""Small POSIX helpers shared by connectors that stage files."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile

from .errors import AttemptFencedError, ConfigurationError
from .txpool import Transaction


def fsync_path(path: str) -> None:
    """Make a file's data, or a directory's entries, durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` all at once (a unique temporary file in the same
    directory, renamed over it): a reader sees the old content or the new, never a
    part. With ``fsync``, the data and the rename are durable when it returns."""
    directory = os.path.dirname(path) or "."
    fd, temp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    if fsync:
        fsync_path(directory)


def require_writable_dir(directory: str, what: str, fix: str) -> None:
    """Create ``directory`` if needed and prove a file can be written there.

    Raises ``ConfigurationError`` naming ``what`` (e.g. "output directory /data/out")
    and ``fix``, before anything of a batch is written.
    """
    probe = os.path.join(directory, f".write-probe-{os.getpid()}")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"ok")
        os.unlink(probe)
    except OSError as exc:
        raise ConfigurationError(
            f"{what} is not writable ({exc.strerror})",
            fix=f"{fix}; nothing of this batch was written",
        ) from None


def claim_dir(directory: str, txn: Transaction) -> str:
    """Create ``txn``'s own staging directory; ``AttemptFencedError`` if another attempt
    holds the same transaction ID (``mkdir`` never succeeds twice)."""
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    try:
        os.mkdir(directory)
    except FileExistsError:
        raise AttemptFencedError(
            f"staging directory {directory} of transaction {txn.txn_id} exists: another "
            "attempt of this task (a zombie of a retried stage) holds the same ID",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="nothing to do: Spark retries this task under the next attempt number",
        ) from None
    return directory


SHARED_CHECK = ".driver-writes-here"


def mark_driver_dir(directory: str) -> None:
    """Leave the file ``require_shared`` looks for (the driver, in ``validate``)."""
    check = os.path.join(directory, SHARED_CHECK)
    if not os.path.exists(check):
        with open(check, "w") as fh:
            fh.write(f"{socket.gethostname()}\n")


def require_shared(directory: str, what: str, txn: Transaction) -> None:
    """In a task: refuse to stage into ``directory`` unless it is the one the driver
    marked, i.e. the driver (and the other executors) will find what is staged there.

    Raises ``ConfigurationError`` naming ``what`` and the fix; the batch is then
    aborted before anything is decided."""
    check = os.path.join(directory, SHARED_CHECK)
    if not os.path.exists(check):
        raise ConfigurationError(
            f"{what} is not shared: the driver wrote {check}, but this executor (host "
            f"{socket.gethostname()}) does not see it, so what it stages there could never "
            "be committed",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="use a directory the driver and every executor reach at the same path "
            "(NFS or another shared mount); nothing of this batch was committed",
        )
