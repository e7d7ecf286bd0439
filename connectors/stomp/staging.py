"""Phase 1 of StompSink: a task attempt's messages staged in one Arrow IPC file.

``<staging_dir>/<attempt txn id>/records.arrow`` holds the serialised messages
(destination, body, headers) of one partition; the attempt's directory is claimed
exclusively, the file is fsynced before the receipt names it, and nothing reaches the
broker until phase 2 reads it back (``staged_messages``). The receipt counts the
messages per destination for the duplicate-ID cache check before the decision.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkeos.core.protocol import Receipt, Transaction
from sparkeos.core.snapshot.fingerprint import Fingerprint
from sparkeos.core.storage.staging import StagingArea, default_dir
from sparkeos.core.text.records import iter_records

from . import errors

STAGED_FILE = "records.arrow"
STAGING_ENV = "SPARKEOS_STOMP_STAGING_DIR"
MESSAGE_IDS = "message_ids"
"""The receipt field that says how the participant's duplicate IDs are made:
``"content"`` (each message's own content and its occurrence, ``publish.frames``);
absent in receipts of an earlier sparkeos, whose messages were numbered by position (a
batch of theirs decided before an upgrade is finished with the IDs it began with)."""
BY_CONTENT = "content"

StagedMessage = tuple[str, bytes | None, dict[str, str] | None]


def default_staging_dir() -> str:
    """``$SPARKEOS_STOMP_STAGING_DIR``, else ``~/.sparkeos/stomp-staging``."""
    return default_dir(STAGING_ENV, "stomp-staging")


def staging_area(root: str) -> StagingArea:
    return StagingArea(root, setting=f"StompSink(staging_dir=...) / ${STAGING_ENV}")


@dataclass
class StagedAttempt:
    """One task attempt's staged file while it is written (the sink's handle)."""

    txn: Transaction
    directory: str
    rows: int = 0
    file: Any = None
    writer: Any = None
    written: str | None = None
    """The local file being written: in place on a POSIX root, else a temporary one that
    ``seal`` uploads."""
    destinations: dict[str, int] = field(default_factory=dict)
    content: Fingerprint = field(default_factory=Fingerprint)
    """What the attempt staged (``core.snapshot.replay``: a replay skips only the same rows)."""

    def append(self, records: pa.RecordBatch, staging: StagingArea,
               destination: str | None) -> None:
        """Add serialised ``records`` (``destination`` names the fixed one)."""
        self.rows += records.num_rows
        self.content.update(records)
        if "topic" in records.schema.names:
            counts = pc.value_counts(records.column("topic"))
            for item in counts.to_pylist():
                self._count(item["values"], item["counts"])
        elif records.num_rows:
            self._count(str(destination), records.num_rows)
        if self.writer is None:
            self.written = staging.writable_file(self.directory, STAGED_FILE)
            self.file = pa.OSFile(self.written, "wb")
            self.writer = pa.ipc.new_file(self.file, records.schema)
        self.writer.write_batch(records)

    def _count(self, destination: str, count: int) -> None:
        self.destinations[destination] = self.destinations.get(destination, 0) + count

    @property
    def empty(self) -> bool:
        return self.writer is None or self.rows == 0

    def seal(self, staging: StagingArea, fsync: bool) -> Receipt:
        """Close the file and make it durable; the receipt phase 2 finds it by."""
        self.writer.close()
        self.file.close()
        relative = staging.seal(self.directory, STAGED_FILE, str(self.written), fsync)
        return {"file": relative, "rows": self.rows,
                "destinations": self.destinations, "host": socket.gethostname(),
                "written": self.content.written().as_json(), MESSAGE_IDS: BY_CONTENT}

    def discard(self, staging: StagingArea) -> None:
        for closable in (self.writer, self.file):
            if closable is not None:
                with contextlib.suppress(Exception):
                    closable.close()
        staging.discard(self.directory, self.written)


def ids_by_content(receipt: Receipt) -> bool:
    """Whether the receipt's messages get IDs by content (``publish.frames``)."""
    return receipt.get(MESSAGE_IDS) == BY_CONTENT


def staged_path(staging: StagingArea, txn: Transaction, receipt: Receipt) -> str:
    """The staged file of a decided transaction (``DataLossError`` if it is gone)."""
    path = staging.staged_file(txn, receipt, txn.txn_id)
    if path is None:
        raise errors.lost(txn, f"the staged file {receipt['file']} of a decided "
                          "transaction is gone")
    return path


def has_staged(staging: StagingArea, txn: Transaction) -> bool:
    return staging.has_file(txn, STAGED_FILE)


def staged_messages(staging: StagingArea, path: str, default: str | None
                    ) -> Iterator[StagedMessage]:
    """The messages of a staged file, in order: (destination, body, headers)."""
    with staging.open_staged(path) as source:
        reader = pa.ipc.open_file(source)
        for i in range(reader.num_record_batches):
            for topic, value, _key, headers in iter_records(reader.get_batch(i)):
                yield (topic or default or "", value,
                       None if headers is None else {
                           k: (v.decode("utf-8", "replace") if isinstance(v, bytes)
                               else str(v)) for k, v in headers if v is not None})
