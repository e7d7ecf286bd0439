"""The acknowledging source's durable spool: messages received but not yet acknowledged.

Layout of a spool directory (one per source; a lock file keeps two queries out)::

    pulls/<first seq>-<last seq>.arrow   messages of one pull, with their sequence numbers
    seen.json                            seen-ID store (core.dedup.SeenIds), keyed by the
                                         pull's last sequence number
    state.json                           {"committed": <highest offset Spark committed>}

Sequence numbers continue from Spark's ``start`` offset, never from the files: a pull
the offset log never recorded (the driver died in between) is dropped at the next
``latestOffset`` and its messages, unacknowledged, come again from the broker.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkeos.core.dedup import SeenIds
from sparkeos.core.errors import ConfigurationError
from sparkeos.core.storage.fsutil import fsync_path, write_atomically

PULL = re.compile(r"^(\d{20})-(\d{20})\.arrow$")
SPOOL_SCHEMA = pa.schema([
    ("seq", pa.int64()),
    ("message_id", pa.string()),
    ("destination", pa.string()),
    ("headers", pa.map_(pa.string(), pa.string())),
    ("body", pa.binary()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
])


@dataclass(frozen=True)
class Pull:
    first: int
    last: int
    path: str


def list_pulls(directory: str) -> list[Pull]:
    pulls_dir = os.path.join(directory, "pulls")
    try:
        names = os.listdir(pulls_dir)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        match = PULL.match(name)
        if match:
            out.append(Pull(int(match.group(1)), int(match.group(2)),
                            os.path.join(pulls_dir, name)))
    return sorted(out, key=lambda p: p.first)


def read_pulls(files: Sequence[str], low: int, high: int) -> Iterator[pa.RecordBatch]:
    """The spooled messages with ``low < seq <= high`` (executors call this)."""
    import pyarrow.compute as pc

    for path in files:
        with pa.memory_map(path) as source:
            table = pa.ipc.open_file(source).read_all()
        seq = table.column("seq")
        mask = pc.and_(pc.greater(seq, low), pc.less_equal(seq, high))
        yield from table.filter(mask).to_batches()


class Spool:
    """The runner process's view of one spool directory (not thread-safe)."""

    def __init__(self, directory: str, *, max_ids: int, fsync: bool = True) -> None:
        self.directory = directory
        self.fsync = fsync
        self._lock_fh: Any = None
        try:
            os.makedirs(os.path.join(directory, "pulls"), exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"the spool directory {directory} cannot be created ({exc.strerror})",
                fix="set stomp_source(spool_dir=...) to a writable directory every executor "
                "reaches at the same path",
            ) from None
        self._take_lock()
        self.seen = self._load_seen(max_ids)
        self.committed = self._load_state().get("committed", 0)

    def _take_lock(self) -> None:
        fh = open(os.path.join(self.directory, ".lock"), "a+")  # noqa: SIM115 (held open)
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise ConfigurationError(
                f"the spool directory {self.directory} is in use by another running query",
                fix="give each query's STOMP source its own spool (stomp_source(name=...) "
                "or spool_dir=...); two readers of one spool would acknowledge each "
                "other's messages",
            ) from None
        self._lock_fh = fh

    def close(self) -> None:
        fh, self._lock_fh = self._lock_fh, None
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()

    # -- state ------------------------------------------------------------------------------
    def _load_seen(self, max_ids: int) -> SeenIds:
        try:
            with open(os.path.join(self.directory, "seen.json"), "rb") as fh:
                seen = SeenIds.from_bytes(fh.read())
        except FileNotFoundError:
            return SeenIds(max_ids)
        seen.max_ids = max(max_ids, len(seen))
        return seen

    def _load_state(self) -> dict[str, Any]:
        try:
            with open(os.path.join(self.directory, "state.json"), "rb") as fh:
                return dict(json.loads(fh.read()))
        except FileNotFoundError:
            return {}

    def save_seen(self) -> None:
        write_atomically(os.path.join(self.directory, "seen.json"), self.seen.to_bytes(),
                         fsync=self.fsync)

    def save_committed(self, committed: int) -> None:
        if committed > self.committed:
            self.committed = committed
            write_atomically(os.path.join(self.directory, "state.json"),
                             json.dumps({"committed": committed}).encode(), fsync=self.fsync)

    # -- pulls ------------------------------------------------------------------------------
    def pulls(self) -> list[Pull]:
        return list_pulls(self.directory)

    def write_pull(self, rows: list[dict[str, Any]]) -> Pull:
        first, last = rows[0]["seq"], rows[-1]["seq"]
        path = os.path.join(self.directory, "pulls", f"{first:020d}-{last:020d}.arrow")
        temp = f"{path}.tmp"
        table = pa.Table.from_pylist(rows, schema=SPOOL_SCHEMA)
        with pa.OSFile(temp, "wb") as sink, pa.ipc.new_file(sink, SPOOL_SCHEMA) as writer:
            writer.write_table(table)
        if self.fsync:
            fsync_path(temp)
        os.replace(temp, path)
        if self.fsync:
            fsync_path(os.path.dirname(path))
        return Pull(first, last, path)

    def message_ids(self, pull: Pull) -> list[str]:
        with pa.memory_map(pull.path) as source:
            table = pa.ipc.open_file(source).read_all()
        return [m for m in table.column("message_id").to_pylist() if m is not None]

    def delete(self, pull: Pull) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pull.path)
