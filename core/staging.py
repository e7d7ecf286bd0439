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
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import DataLossError, RetriableError
from .fsutil import claim_dir, fsync_path, mark_driver_dir, require_shared, require_writable_dir
from .protocol import Receipt
from .txpool import AttemptRange, Transaction, TransactionPool


def default_dir(env_var: str, name: str) -> str:
    """``$env_var`` if set, else ``~/.sparkeos/<name>`` (fine for ``local[*]`` Spark)."""
    configured = os.environ.get(env_var)
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    return os.path.join(os.path.expanduser("~"), ".sparkeos", name)


@dataclass(frozen=True)
class StagingArea:
    root: str
    prefix: str = ""
    """Put before every attempt directory's name (e.g. a transactional ID prefix)."""
    setting: str = "staging_dir=..."
    """How the user sets the directory (error messages name it)."""

    @property
    def label(self) -> str:
        return f"staging_dir {self.root}"

    def txn_dir(self, txn: Transaction) -> str:
        return os.path.join(self.root, self.prefix + txn.txn_id)

    # -- driver ----------------------------------------------------------------------------
    def check_on_driver(self) -> None:
        """Writable, and marked so tasks can prove they see the same directory."""
        require_writable_dir(
            self.root, self.label,
            f"create it and give the Spark user write access, or set {self.setting} to a "
            "directory every executor can reach at the same path",
        )
        mark_driver_dir(self.root)

    # -- phase 1 ---------------------------------------------------------------------------
    def claim(self, txn: Transaction) -> str:
        """The attempt's own directory, created exclusively (``AttemptFencedError`` if
        another attempt holds the ID), in the directory the driver marked."""
        require_shared(self.root, self.label, txn)
        return claim_dir(self.txn_dir(txn), txn)

    def make_durable(self, path: str) -> None:
        """fsync a staged file and the directories leading to it from the root."""
        fsync_path(path)
        directory = os.path.dirname(path)
        while True:
            fsync_path(directory)
            if os.path.normpath(directory) == os.path.normpath(self.root):
                return
            directory = os.path.dirname(directory)

    def relative(self, path: str) -> str:
        return os.path.relpath(path, self.root)

    # -- phase 2 and cleanup ----------------------------------------------------------------
    def delete(self, txn: Transaction) -> None:
        shutil.rmtree(self.txn_dir(txn), ignore_errors=True)

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        """Delete the attempts of ``ranges`` not in ``keep``: one listing of the root
        instead of one call per possible ID."""
        if not ranges:
            return
        pool = TransactionPool(ranges[0].query_key, ranges[0].sink)
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return
        for name in names:
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
        path = os.path.normpath(os.path.join(self.root, str(receipt["file"])))
        if not path.startswith(os.path.normpath(self.root) + os.sep):
            raise DataLossError(
                f"receipt names a staged file outside staging_dir: {receipt['file']!r}",
                sink=txn.sink, batch_id=txn.batch_id, txn_id=shown_id,
                fix="the commit log was edited or belongs to another sink configuration",
            )
        if os.path.exists(path):
            return path
        staged_on, host = receipt.get("host"), socket.gethostname()
        if staged_on and staged_on != host:
            raise RetriableError(
                f"staged file {path} was written on host {staged_on}, but this commit runs "
                f"on {host}, where it does not exist",
                sink=txn.sink, batch_id=txn.batch_id, txn_id=shown_id,
                fix="staging_dir must be a directory every executor reaches at the same path "
                "(a shared mount); restart the query once it is: the batch is decided and "
                "is committed then",
            )
        return None


__all__ = ["StagingArea", "default_dir"]
