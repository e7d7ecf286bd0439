"""What a participant wrote, as a count and a content fingerprint of its rows.

A replay of a batch is not the run that crashed: Spark replays the input, not its
partitioning (a restart on fewer cores, another ``repartition``), so partition ``p`` of
the replay may hold other rows than partition ``p`` of the run that committed. A
connector that skips a participant on a replay because a marker says "(batch N,
partition p) is committed" must first know that the replay's participant holds the same
rows: it records a ``Written`` with each marker and skips only on an equal one
(``Written.same_as``); otherwise it writes again (at-least-once may duplicate, never
lose) and reports the difference.

``Fingerprint`` is fed every Arrow batch the participant writes, while it writes them
(no second pass over the data): SHA-256 over the logical content of each column,
stream by stream, so the result does not depend on how the rows were cut into Arrow
batches, on the offsets of sliced arrays or on what lies under a null. It does depend
on the order of the rows: a replay whose partition holds the same rows in another
order counts as different (written again), never as the same.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FINGERPRINT_HEX = 32
"""Hex digits kept of the SHA-256 digest (128 bits)."""


@dataclass(frozen=True)
class Written:
    """What one participant wrote: its row count and fingerprint (a JSON-able pair)."""

    rows: int
    fingerprint: str

    def as_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "fingerprint": self.fingerprint}

    @classmethod
    def from_json(cls, data: Any) -> Written | None:
        """The ``Written`` of a receipt, marker or record; None if it holds none (a
        marker written before fingerprints were recorded never counts as the same)."""
        if not isinstance(data, dict):
            return None
        rows, fingerprint = data.get("rows"), data.get("fingerprint")
        if not isinstance(rows, int) or not isinstance(fingerprint, str) or not fingerprint:
            return None
        return cls(rows, fingerprint)

    def same_as(self, recorded: Written | None) -> bool:
        """True only when ``recorded`` is known and equal: the one test a replay may
        skip on."""
        return recorded is not None and recorded == self


class Fingerprint:
    """Accumulates the rows a participant writes; ``written()`` gives the result."""

    def __init__(self) -> None:
        self.rows = 0
        self._streams: dict[str, Any] = {}
        self._counts: dict[str, int] = {}
        self._names: list[str] | None = None

    def update(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Add the rows of ``batch`` (in order)."""
        if isinstance(batch, pa.Table):
            for chunk in batch.to_batches():
                self.update(chunk)
            return
        if self._names is None:
            self._names = list(batch.schema.names)
        for index, column in enumerate(batch.columns):
            self._array(f"{index}", column)
        self.rows += batch.num_rows

    def written(self) -> Written:
        return Written(self.rows, self.hexdigest())

    def hexdigest(self) -> str:
        total = hashlib.sha256()
        total.update(repr((self.rows, self._names or [])).encode())
        for key in sorted(self._streams):
            total.update(key.encode() + b"\0" + self._streams[key].digest())
        return total.hexdigest()[:FINGERPRINT_HEX]

    # -- the streams -----------------------------------------------------------------------
    def _feed(self, key: str, data: Any) -> None:
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = hashlib.sha256()
        stream.update(data)

    def _array(self, path: str, array: pa.Array) -> None:
        """One array's content under ``path``: its null positions, then its values."""
        kind = array.type
        if isinstance(kind, pa.ExtensionType):
            array, kind = array.storage, kind.storage_type
        if pa.types.is_dictionary(kind):
            array = array.dictionary_decode()
            kind = array.type
        if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
            array = array.cast(pa.large_binary())
            kind = array.type
        base = self._counts.get(path, 0)
        self._counts[path] = base + len(array)
        if array.null_count:
            nulls = np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))
            self._feed(path + "/nulls", (nulls.astype(np.int64) + base).tobytes())
        if pa.types.is_null(kind) or len(array) == 0:
            return
        if pa.types.is_boolean(kind):
            values = pc.fill_null(array, False).to_numpy(zero_copy_only=False)
            self._feed(path + "/values", values.astype(np.uint8).tobytes())
        elif _is_fixed_width(kind):
            self._fixed(path, array)
        elif (pa.types.is_string(kind) or pa.types.is_binary(kind)
              or pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)):
            self._variable(path, array)
        elif pa.types.is_struct(kind):
            for index, child in enumerate(array.flatten()):
                self._array(f"{path}/{index}", child)
        elif pa.types.is_fixed_size_list(kind):
            self._array(path + "/items", array.flatten())
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
            offsets = array.offsets.to_numpy()
            self._feed(path + "/lengths", np.diff(offsets).astype(np.int64).tobytes())
            values = (pa.StructArray.from_arrays([array.keys, array.items], ["key", "value"])
                      if pa.types.is_map(kind) else array.values)
            first, last = int(offsets[0]), int(offsets[-1])
            self._array(path + "/items", values.slice(first, last - first))
        else:  # unions, run-end encoded and what comes next: slow but exact
            self._feed(path + "/values", repr(array.to_pylist()).encode())

    def _fixed(self, path: str, array: pa.Array) -> None:
        width = array.type.bit_width // 8
        data = array.buffers()[1]
        assert data is not None
        raw = np.frombuffer(data, dtype=np.uint8, count=(array.offset + len(array)) * width)
        values = raw[array.offset * width:].reshape(len(array), width)
        if array.null_count:  # what lies under a null is not content
            values = values.copy()
            values[array.is_null().to_numpy(zero_copy_only=False)] = 0
        self._feed(path + "/values", values.tobytes())

    def _variable(self, path: str, array: pa.Array) -> None:
        large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
        _validity, offsets_buffer, data = array.buffers()
        assert offsets_buffer is not None
        offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if large else np.int32,
                                count=array.offset + len(array) + 1)[array.offset:]
        self._feed(path + "/lengths", np.diff(offsets).astype(np.int64).tobytes())
        if data is not None and offsets[-1] > offsets[0]:
            self._feed(path + "/bytes", memoryview(data)[int(offsets[0]):int(offsets[-1])])


def _is_fixed_width(kind: pa.DataType) -> bool:
    fixed = (pa.types.is_integer(kind) or pa.types.is_floating(kind)
             or pa.types.is_temporal(kind) or pa.types.is_decimal(kind)
             or pa.types.is_fixed_size_binary(kind))
    return bool(fixed and kind.bit_width % 8 == 0)


def fingerprint_of(*batches: pa.RecordBatch) -> Written:
    """The ``Written`` of ``batches`` (in order): for tests and one-off checks."""
    fingerprint = Fingerprint()
    for batch in batches:
        fingerprint.update(batch)
    return fingerprint.written()


__all__ = ["FINGERPRINT_HEX", "Fingerprint", "Written", "fingerprint_of"]
