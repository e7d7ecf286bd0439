"""Small helpers shared by connectors that stage files: POSIX paths by default, or any
``core.storage.files.Files`` (HDFS) passed as ``files``."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sparkeos.core.errors import AttemptFencedError, ConfigurationError, RetriableError
from sparkeos.core.snapshot.txpool import Transaction
from sparkeos.core.storage.stores.local import LocalFiles

from .files import Files
from .registry import split_uri

_LOCAL = LocalFiles()


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


def require_writable_dir(directory: str, what: str, fix: str, files: Files = _LOCAL) -> None:
    """Create ``directory`` if needed and prove a file can be written there.

    Raises ``ConfigurationError`` naming ``what`` (e.g. "output directory /data/out")
    and ``fix``, before anything of a batch is written.
    """
    probe = os.path.join(directory, f".write-probe-{socket.gethostname()}-{os.getpid()}")
    try:
        files.makedirs(directory)
        files.delete(probe)
        files.create_new(probe, b"ok")
        files.delete(probe)
    except RetriableError:
        raise
    except OSError as exc:
        raise ConfigurationError(
            f"{what} is not writable ({exc.strerror or exc})",
            fix=f"{fix}; nothing of this batch was written",
        ) from None


def claim_dir(directory: str, txn: Transaction, files: Files = _LOCAL) -> str:
    """Create ``txn``'s own staging directory; ``AttemptFencedError`` if another attempt
    holds the same transaction ID (a claim never succeeds twice)."""
    if not files.claim_dir(directory):
        raise AttemptFencedError(
            f"staging directory {files.uri(directory)} of transaction {txn.txn_id} exists: "
            "another attempt of this task (a zombie of a retried stage) holds the same ID",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="nothing to do: Spark retries this task under the next attempt number",
        )
    return directory


MARK_PREFIX = ".driver-mark-"


@dataclass(frozen=True)
class DriverMark:
    """A file the driver left in a directory it shares with the executors: ``name``,
    holding ``token``, both fresh for each sink instance (one query run). A task that
    finds it, with that token, sees the driver's directory, not a copy of it on its own
    disk (a fixed name would be found in a stale copy too)."""

    name: str
    token: str


def mark_driver_dir(directory: str, files: Files = _LOCAL) -> DriverMark:
    """Leave a fresh mark for ``require_shared`` (the driver, once per query run), and
    remove the marks of earlier drivers on this host whose process is gone."""
    token = uuid.uuid4().hex
    mark = DriverMark(f"{MARK_PREFIX}{token}", token)
    host = socket.gethostname()
    for name in files.listdir(directory):
        if name.startswith(MARK_PREFIX):
            _remove_if_orphaned(files, os.path.join(directory, name), host)
    files.create_new(os.path.join(directory, mark.name),
                     f"{token}\n{host}\n{os.getpid()}\n".encode())
    return mark


def _remove_if_orphaned(files: Files, path: str, host: str) -> None:
    try:
        _token, written_on, pid = files.read(path).decode().split("\n")[:3]
        alive = written_on != host or _pid_alive(int(pid))
    except (OSError, ValueError):
        return  # unreadable or half-written: leave it
    if not alive:
        files.delete(path)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def require_shared(directory: str, what: str, txn: Transaction, mark: DriverMark | None,
                   files: Files = _LOCAL) -> None:
    """In a task: refuse to stage into ``directory`` unless it holds the driver's
    ``mark``, i.e. the driver (and the other executors) will find what is staged there.

    Raises ``ConfigurationError`` naming ``what`` and the fix; the batch is then
    aborted before anything is decided."""
    if mark is None:
        raise ConfigurationError(
            f"{what}: the sink reached a task without the driver's mark of the directory "
            "(its validate() did not run on the driver before phase 1)",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="run the sink through exactly_once()/at_least_once() (or call validate() "
            "on the driver before begin()); nothing of this batch was committed")
    check = os.path.join(directory, mark.name)
    try:
        seen = files.read(check).decode(errors="replace").split("\n", 1)[0]
    except FileNotFoundError:
        seen = None
    if seen != mark.token:
        raise ConfigurationError(
            f"{what} is not shared: the driver wrote {files.uri(check)}, but this executor "
            f"(host {socket.gethostname()}) does not see it, so what it stages there could "
            "never be committed",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="use a directory the driver and every executor reach at the same path "
            "(NFS or another shared mount, or HDFS); nothing of this batch was committed",
        )


SHARED_PROBE = ".shared-check-"


@dataclass(frozen=True)
class _ExecutorSide:
    """What one task of the check does: look for the driver's probe in every path and
    leave one of its own there."""

    paths: tuple[str, ...]
    token: str

    def __call__(self, index: int) -> tuple[str, list[str]]:
        unseen = []
        for path in self.paths:
            files, directory = split_uri(path)
            if not files.exists(os.path.join(directory, f"{SHARED_PROBE}{self.token}")):
                unseen.append(path)
                continue
            mine = os.path.join(directory, f"{SHARED_PROBE}{self.token}-{index}")
            with contextlib.suppress(FileExistsError):  # a retried task
                files.create_new(mine, socket.gethostname().encode())
        return socket.gethostname(), unseen


def require_shared_on_executors(
        run_in_tasks: Callable[[Callable[[int], tuple[str, list[str]]], Sequence[int]],
                               list[tuple[str, list[str]]]],
        paths: Sequence[str], tasks: int, sink: str) -> None:
    """Prove that the driver and the executors see each path as one directory, before
    anything is staged: the driver leaves a probe file named by a fresh token, ``tasks``
    tasks (spread over the executors) look for it and leave their own, and the driver
    reads theirs. ``ConfigurationError`` names the path and the host that differs."""
    token = uuid.uuid4().hex
    fix = ("use a directory the driver and every executor reach at the same path (NFS or "
           "another shared mount), or HDFS; nothing was written")
    probes: list[tuple[Files, str]] = []
    try:
        for path in paths:
            files, directory = split_uri(path)
            files.makedirs(directory)
            files.create_new(os.path.join(directory, f"{SHARED_PROBE}{token}"),
                             socket.gethostname().encode())
            probes.append((files, directory))
        results = run_in_tasks(_ExecutorSide(tuple(paths), token), list(range(tasks)))
        for index, (host, unseen) in enumerate(results):
            if unseen:
                raise ConfigurationError(
                    f"{unseen[0]} is not shared: the driver (host {socket.gethostname()}) "
                    f"wrote a file there that an executor on host {host} does not see",
                    sink=sink, fix=fix)
            for path, (files, directory) in zip(paths, probes, strict=True):
                if not files.exists(os.path.join(directory, f"{SHARED_PROBE}{token}-{index}")):
                    raise ConfigurationError(
                        f"{path} is not shared: an executor on host {host} wrote a file "
                        "there that the driver does not see", sink=sink, fix=fix)
    finally:
        for files, directory in probes:
            for name in files.listdir(directory):
                if name.startswith(f"{SHARED_PROBE}{token}"):
                    files.delete(os.path.join(directory, name))
