"""A staging directory for sinks that cannot hold a prepared transaction in the
destination itself (Kafka, STOMP): phase 1 writes each attempt's data into its own
directory ``<root>/<prefix><attempt txn id>/``, phase 2 publishes it from there.

What every such sink needs, in one place: the driver's writable-and-shared check, an
exclusive claim per attempt (a zombie with the same ID is fenced), fsync of what was
staged, a sweep that lists the directory once, and finding a decided attempt's file
again (another host's local disk is a configuration error, not data loss).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import socket
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkeos.core.errors import DataLossError, RetriableError
from sparkeos.core.protocol import Receipt
from sparkeos.core.snapshot.txpool import AttemptRange, Transaction, TransactionPool

from .files import Files
from .fsutil import DriverMark, claim_dir, mark_driver_dir, require_shared, require_writable_dir
from .registry import split_uri

CHECKPOINT_STAGING = "sparkeos-staging"
"""A sink's staging directory beside its query's state:
``<checkpointLocation>/sparkeos-staging/<sink name>``."""


def checkpoint_staging_dir(location: str, sink_name: str) -> str:
    """Under the query's checkpoint: shared by every driver restart and, on a cluster,
    by every executor (the checkpoint must be)."""
    return f"{location.rstrip('/')}/{CHECKPOINT_STAGING}/{sink_name}"


def default_dir(env_var: str, name: str) -> str:
    """``$env_var`` if set, else ``~/.sparkeos/<name>`` (fine for ``local[*]`` Spark)."""
    configured = os.environ.get(env_var)
    if configured:
        return configured if "://" in configured else os.path.abspath(
            os.path.expanduser(configured))
    return os.path.join(os.path.expanduser("~"), ".sparkeos", name)


@dataclass(frozen=True)
class StagingArea:
    root: str
    """A local or shared POSIX path, or an HDFS URI (``core.storage.files``)."""
    prefix: str = ""
    """Put before every attempt directory's name (e.g. a transactional ID prefix)."""
    setting: str = "staging_dir=..."
    """How the user sets the directory (error messages name it)."""

    def __post_init__(self) -> None:
        files, path = split_uri(self.root)
        object.__setattr__(self, "_files", files)
        object.__setattr__(self, "_path", path)

    @property
    def files(self) -> Files:
        files: Files = self.__dict__["_files"]
        return files

    @property
    def path(self) -> str:
        """The root inside its file system."""
        path: str = self.__dict__["_path"]
        return path

    @property
    def label(self) -> str:
        return f"staging_dir {self.root}"

    def txn_dir(self, txn: Transaction) -> str:
        return posixpath.join(self.path, self.prefix + txn.txn_id)

    # -- driver ----------------------------------------------------------------------------
    @property
    def needs_sharing(self) -> bool:
        """A POSIX root is shared only by a mount (``shared_paths`` of the sink)."""
        return self.files.is_local

    def check_on_driver(self, mark: DriverMark | None = None) -> DriverMark:
        """Writable, and marked so tasks can prove they see the same directory: the
        sink keeps the mark this returns (pass it back on later batches: it is made once
        per query run) and hands it to ``claim``."""
        require_writable_dir(
            self.path, self.label,
            f"create it and give the Spark user write access, or set {self.setting} to a "
            "directory every executor can reach at the same path", self.files,
        )
        return mark if mark is not None else mark_driver_dir(self.path, self.files)

    # -- phase 1 ---------------------------------------------------------------------------
    def claim(self, txn: Transaction, mark: DriverMark | None) -> str:
        """The attempt's own directory, created exclusively (``AttemptFencedError`` if
        another attempt holds the ID), in the directory the driver marked."""
        require_shared(self.path, self.label, txn, mark, self.files)
        return claim_dir(self.txn_dir(txn), txn, self.files)

    def writable_file(self, directory: str, name: str) -> str:
        """The local path a task writes the staged file ``name`` of ``directory`` to:
        in place on a POSIX root, else a temporary file on this host that ``seal``
        uploads."""
        if self.files.is_local:
            return os.path.join(directory, name)
        return os.path.join(tempfile.mkdtemp(prefix="sparkeos-stage-"), name)

    def seal(self, directory: str, name: str, written: str, fsync: bool) -> str:
        """Make the staged file durable where phase 2 finds it (upload it whole, or
        fsync it in place); returns its path relative to the root (for the receipt)."""
        staged = posixpath.join(directory, name)
        if not self.files.is_local:
            try:
                self.files.upload_new(written, staged)
            finally:
                shutil.rmtree(os.path.dirname(written), ignore_errors=True)
        elif fsync:
            self.make_durable(staged)
        return posixpath.relpath(staged, self.path)

    def discard(self, directory: str, written: str | None) -> None:
        """Delete an attempt's directory and the local file it was writing."""
        if written and not self.files.is_local:
            shutil.rmtree(os.path.dirname(written), ignore_errors=True)
        self.files.delete(directory)

    def make_durable(self, path: str) -> None:
        """fsync a staged file and the directories leading to it from the root."""
        files = self.files
        files.make_durable(path)
        directory = posixpath.dirname(path)
        while True:
            files.make_durable(directory)
            if posixpath.normpath(directory) == posixpath.normpath(self.path):
                return
            directory = posixpath.dirname(directory)

    # -- phase 2 and cleanup ----------------------------------------------------------------
    def has_file(self, txn: Transaction, name: str) -> bool:
        return self.files.exists(posixpath.join(self.txn_dir(txn), name))

    def is_claimed(self, txn: Transaction) -> bool:
        return self.files.isdir(self.txn_dir(txn))

    def delete(self, txn: Transaction) -> None:
        self.files.delete(self.txn_dir(txn))

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        """Delete the attempts of ``ranges`` not in ``keep``: one listing of the root
        instead of one call per possible ID."""
        if not ranges:
            return
        pool = TransactionPool(ranges[0].query_key, ranges[0].sink)
        for name in self.files.listdir(self.path):
            if not name.startswith(self.prefix):
                continue
            txn = pool.parse(name[len(self.prefix):])
            if txn is not None and txn.txn_id not in keep and any(
                    r.covers(txn) for r in ranges):
                self.delete(txn)

    def staged_file(self, txn: Transaction, receipt: Receipt, shown_id: str) -> str | None:
        """The staged file ``receipt`` names, or None if it is gone. Raises
        ``DataLossError`` for a receipt pointing outside the root, and
        ``RetriableError`` if it was staged on another host (the directory is not
        shared: fix the mount, the decided batch is committed then)."""
        path = posixpath.normpath(posixpath.join(self.path, str(receipt["file"])))
        if not path.startswith(posixpath.normpath(self.path) + "/"):
            raise DataLossError(
                f"receipt names a staged file outside staging_dir: {receipt['file']!r}",
                sink=txn.sink, batch_id=txn.batch_id, txn_id=shown_id,
                fix="the commit log was edited or belongs to another sink configuration",
            )
        if self.files.exists(path):
            return path
        staged_on, host = receipt.get("host"), socket.gethostname()
        if staged_on and staged_on != host and self.files.is_local:
            raise RetriableError(
                f"staged file {path} was written on host {staged_on}, but this commit runs "
                f"on {host}, where it does not exist",
                sink=txn.sink, batch_id=txn.batch_id, txn_id=shown_id,
                fix="staging_dir must be a directory every executor reaches at the same path "
                "(a shared mount, or HDFS); restart the query once it is: the batch is "
                "decided and is committed then",
            )
        return None

    def open_staged(self, path: str) -> Any:
        """A pyarrow input file over a staged file (memory-mapped where it is local)."""
        import pyarrow as pa

        if self.files.is_local:
            return pa.memory_map(path)
        return pa.BufferReader(self.files.read(path))


__all__ = ["StagingArea", "default_dir"]
