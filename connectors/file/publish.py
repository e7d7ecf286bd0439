"""Phase 2 of the file sink: a decided attempt's staged part file moves to its final
name, once.

The move (``link`` on POSIX, ``rename`` on HDFS) is atomic and never replaces an
existing file, so a zombie can never overwrite a committed file, and a final file that
exists already holds these rows (its name carries their fingerprint): the commit was
done before (a twin commit, a retried call, an earlier run of the same partition), and
the commit is idempotent. A staged file that is gone while the final one is missing is
either on another host (the directory is not shared) or lost.
"""

from __future__ import annotations

import posixpath
import socket

from sparkeos.core.errors import ConfigurationError, DataLossError
from sparkeos.core.protocol import Receipt, Transaction
from sparkeos.core.snapshot.fingerprint import Written
from sparkeos.core.snapshot.replay import OnRecord, committed_before
from sparkeos.core.steps import commit_step
from sparkeos.core.storage.files import Files


def publish(files: Files, txn: Transaction, receipt: Receipt, staging: str, root: str,
            fsync: bool) -> None:
    """Move the file ``receipt`` names from the attempt's ``staging`` directory into
    ``root`` (from each partition directory it names into the same one under ``root``),
    then delete the staging directory."""
    name = receipt.get("file")
    if name:
        final_name = receipt.get("final") or name
        # Receipts from before part files named their content carry only ``file``.
        for directory in receipt.get("dirs") or [""]:
            _publish_one(files, txn, receipt, posixpath.join(staging, directory, name),
                         posixpath.join(root, directory, final_name), fsync,
                         in_partition=bool(directory))
    files.delete(staging)


def _publish_one(files: Files, txn: Transaction, receipt: Receipt, staged: str, final: str,
                 fsync: bool, in_partition: bool) -> None:
    if _committed_before(files, txn, receipt, final):
        return
    commit_step("checked", txn)
    directory = posixpath.dirname(final)
    try:
        if in_partition:  # a partition directory this batch may open (idempotent)
            files.makedirs(directory)
        # Never over an existing file: a zombie can never overwrite a committed one.
        files.publish(staged, final)
    except FileExistsError:
        pass
    except FileNotFoundError:
        # A twin commit of the same decided transaction (the driver and `recover
        # --force`, a retried call) may have published it, and deleted the staging
        # directory after its last file, since the check above.
        if files.exists(final):
            return
        raise _staged_file_gone(files, txn, receipt, staged, final) from None
    if fsync:
        files.make_durable(directory)
    commit_step("published", txn)


def _committed_before(files: Files, txn: Transaction, receipt: Receipt, final: str) -> bool:
    """A final file of this name is the record that this (batch, partition) committed
    these rows: its name carries their fingerprint (``core.snapshot.replay``)."""
    written = Written.from_json(receipt.get("written"))
    on_record = OnRecord.of_batch(txn.batch_id, [written] if files.exists(final) else [])
    return committed_before(txn, written, on_record)


def _staged_file_gone(files: Files, txn: Transaction, receipt: Receipt, staged: str,
                      final: str) -> Exception:
    staged_on = receipt.get("host")
    if staged_on and staged_on != socket.gethostname():
        return ConfigurationError(
            f"staged file {files.uri(staged)} was written on host {staged_on}, but "
            f"the commit runs on {socket.gethostname()}, where it does not "
            "exist: the output directory is not shared",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="make the directory reachable at the same path from the "
            "driver and every executor, then restart the query: the batch "
            "is decided and is committed then",
        )
    return DataLossError(
        f"staged file {files.uri(staged)} of a decided transaction is gone "
        f"and {files.uri(final)} does not exist",
        sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
        fix="something deleted the hidden staging directory; restore it from "
        "a backup, or re-process this batch from the source",
    )
