"""What a participant wrote, as a count and a content fingerprint of its rows.

A replay of a batch is not the run that crashed: Spark replays the input, not its
partitioning (a restart on fewer cores, another ``repartition``), and not its order (a
shuffle upstream hands a partition its rows in whatever order its map outputs arrive).
A connector that skips a participant on a replay because a marker says "(batch N,
partition p) is committed" must first know that the replay's participant holds the same
rows: it records a ``Written`` with each marker and the replay rule (``core.snapshot.replay``)
skips only on an equal one.

The fingerprint is a hash of the **multiset** of rows: the same rows in any order, cut
into Arrow batches anywhere, give the same fingerprint; any other row, a row more or a
row less gives another. It is fed every Arrow batch the participant writes, while it
writes them (no second pass over the data, no row kept):

* each value gets a 64-bit hash, computed column by column with numpy: fixed-width
  values from their bits, variable-width ones from their bytes read as 64-bit words each
  mixed with its position (a window of bytes at a time, so memory stays bounded however
  long the values), nested values from their children (a list's items with their
  position in the list, a struct's fields with their index), a null from a constant of
  its own (what lies under a null is never content);
* a row's hash combines its columns' hashes with each column's index;
* the fingerprint is the row count and two sums modulo 2**64, of the rows' hashes and
  of a second mix of them, digested with the column names (SHA-256, 128 bits kept).

A replay that differs from the record in one row matches it by accident with a chance
of about 2**-64 (the two rows' hashes must be equal), in several rows far less. It is
not a cryptographic hash: values that collide can be constructed on purpose (a
participant's rows are the job's own data, not an adversary's). Within a value order
counts: a map's entries or a list in another order are another value (written again
under at-least-once, never lost).
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
ALGORITHM = "multiset-v1"
"""Digested into every fingerprint: a fingerprint of another algorithm (an earlier
sparkeos hashed the rows in order) never equals one of this."""

_U64 = np.uint64
_LANES = ((_U64(0xFF51AFD7ED558CCD), _U64(0xC4CEB9FE1A85EC53)),   # murmur3's fmix64
          (_U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)))   # splitmix64's finaliser
_GOLDEN = _U64(0x9E3779B97F4A7C15)
_NULL = _U64(0x6A09E667F3BCC908)
_EMPTY = _U64(0x3C6EF372FE94F82B)
_ALL_BITS = _U64(0xFFFFFFFFFFFFFFFF)
CHUNK_ROWS = 16_384


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
        self._sums = [_U64(0), _U64(0)]
        self._names: list[str] | None = None

    def update(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Add the rows of ``batch`` (in any order: the result is the same)."""
        if isinstance(batch, pa.Table):
            for chunk in batch.to_batches():
                self.update(chunk)
            return
        if self._names is None:
            self._names = list(batch.schema.names)
        for start in range(0, batch.num_rows, CHUNK_ROWS):
            # A slice at a time: numpy's passes then run over arrays the caches hold.
            rows = row_hashes(batch.slice(start, CHUNK_ROWS))
            with np.errstate(over="ignore"):
                self._sums[0] = _U64(self._sums[0] + rows.sum(dtype=_U64))
                self._sums[1] = _U64(self._sums[1] + _mix(rows, 1).sum(dtype=_U64))
        self.rows += batch.num_rows

    def written(self) -> Written:
        return Written(self.rows, self.hexdigest())

    def hexdigest(self) -> str:
        total = hashlib.sha256()
        # No rows, no columns: an empty partition is one whatever schema it was fed.
        total.update(repr((ALGORITHM, self.rows, self._names if self.rows else [],
                           int(self._sums[0]), int(self._sums[1]))).encode())
        return total.hexdigest()[:FINGERPRINT_HEX]


def row_hashes(batch: pa.RecordBatch) -> np.ndarray:
    """One 64-bit hash per row of ``batch`` (``uint64``), as the fingerprint sums them:
    the content of a row, whatever batch it came in."""
    return _combine([_values(column) for column in batch.columns], batch.num_rows)


def salted_sum(hashes: np.ndarray, salts: np.ndarray, lane: int) -> int:
    """The sum modulo 2**64 of ``hashes``, each mixed with its salt (a position) in one
    of two independent lanes: a hash of the sequence, additive over its parts."""
    with np.errstate(over="ignore"):
        mixed = _mix(_salted(hashes, salts), lane)
        return int(mixed.sum(dtype=_U64))


def fingerprint_of(*batches: pa.RecordBatch | pa.Table) -> Written:
    """The ``Written`` of ``batches``: for tests and one-off checks."""
    fingerprint = Fingerprint()
    for batch in batches:
        fingerprint.update(batch)
    return fingerprint.written()


# -- hashing, vectorised --------------------------------------------------------------------
def _mix(values: np.ndarray, lane: int = 0) -> np.ndarray:
    """A 64-bit finaliser: a bijection that spreads every input bit over the output."""
    first, second = _LANES[lane]
    with np.errstate(over="ignore"):
        values = values ^ (values >> _U64(33))
        values = values * first
        values = values ^ (values >> _U64(29))
        values = values * second
        mixed: np.ndarray = values ^ (values >> _U64(32))
    return mixed


def _salted(hashes: np.ndarray, salt: np.ndarray | int) -> np.ndarray:
    """Each hash mixed with ``salt`` (its column, field, position or length); for a
    fixed salt a bijection, so values that differ keep differing."""
    with np.errstate(over="ignore"):
        return _mix(hashes + np.asarray(salt, dtype=_U64) * _GOLDEN)


def _combine(parts: list[np.ndarray], count: int) -> np.ndarray:
    """One hash per row from the hashes of its columns (or fields), each salted with
    its index."""
    total = np.zeros(count, dtype=_U64)
    with np.errstate(over="ignore"):
        for index, part in enumerate(parts):
            total += _salted(part, index + 1)
    return _mix(total)


def _values(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The hash of each value of ``array``."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    kind = array.type
    if isinstance(kind, pa.ExtensionType):
        return _values(array.storage)
    if pa.types.is_dictionary(kind):
        return _values(array.dictionary_decode())
    if pa.types.is_string_view(kind) or pa.types.is_binary_view(kind):
        return _values(array.cast(pa.large_binary()))
    if pa.types.is_null(kind):
        return np.full(len(array), _NULL, dtype=_U64)
    if pa.types.is_boolean(kind):
        bits = pc.fill_null(array, False).to_numpy(zero_copy_only=False)
        hashes = _salted(bits.astype(_U64), 1)
    elif _is_fixed_width(kind):
        hashes = _fixed(array)
    elif (pa.types.is_string(kind) or pa.types.is_binary(kind)
          or pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)):
        hashes = _variable(array)
    elif pa.types.is_fixed_size_binary(kind):
        hashes = _variable(array.cast(pa.large_binary()))
    elif pa.types.is_struct(kind):
        fields = [_values(child) for child in array.flatten()]
        hashes = _combine(fields, len(array)) if fields else np.full(len(array), _EMPTY,
                                                                       dtype=_U64)
    elif pa.types.is_fixed_size_list(kind):
        size = kind.list_size
        offsets = (np.arange(len(array) + 1, dtype=np.int64) + array.offset) * size
        hashes = _lists(offsets, array.values)
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        values = (pa.StructArray.from_arrays([array.keys, array.items], ["key", "value"])
                  if pa.types.is_map(kind) else array.values)
        hashes = _lists(array.offsets.to_numpy().astype(np.int64), values)
    else:  # unions, run-end encoded and what comes next: slow but exact
        hashes = _python(array)
    if array.null_count:  # what lies under a null is not content
        hashes = np.where(array.is_null().to_numpy(zero_copy_only=False), _NULL, hashes)
    return hashes


def _fixed(array: pa.Array) -> np.ndarray:
    """Integers, floats, temporal values and decimals, from their bits."""
    width = array.type.bit_width // 8
    data = array.buffers()[1]
    assert data is not None
    raw = np.frombuffer(data, dtype=np.uint8, count=(array.offset + len(array)) * width)
    raw = raw[array.offset * width:]
    if width in (1, 2, 4, 8):
        return _salted(raw.view(f"<u{width}").astype(_U64), width)
    # 16 and 32 bytes (decimals, intervals): as byte strings of one length
    return _bytes(raw, np.arange(len(array) + 1, dtype=np.int64) * width)


def _variable(array: pa.Array) -> np.ndarray:
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    _validity, offsets_buffer, data = array.buffers()
    assert offsets_buffer is not None
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if large else np.int32,
                            count=array.offset + len(array) + 1)[array.offset:]
    start, end = int(offsets[0]), int(offsets[-1])
    raw = (np.frombuffer(data, dtype=np.uint8, count=end)[start:end] if data is not None
           else np.zeros(0, dtype=np.uint8))
    return _bytes(raw, offsets.astype(np.int64) - start)


WINDOW_BYTES = 1 << 22
"""Bytes of strings hashed at a time: numpy's temporaries are a few times this, however
many strings a batch holds."""
LARGE_BYTES = 1024
"""Strings of this many bytes or more are hashed one by one with BLAKE2b, which runs at
memory speed (per string, its fixed cost is small against the bytes)."""


def _bytes(raw: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The hash of each byte string ``raw[offsets[i]:offsets[i+1]]``. A string shorter
    than ``LARGE_BYTES``: its bytes read as 64-bit little-endian words (the last one
    zero-padded), each word mixed with its position in the string, summed, and mixed
    with the string's length (``WINDOW_BYTES`` of strings at a time); a longer one: its
    BLAKE2b digest, mixed with its length. Which of the two depends on the string
    alone."""
    lengths = np.diff(offsets)
    hashes = np.empty(len(lengths), dtype=_U64)
    large = lengths >= LARGE_BYTES
    if large.any():
        view = memoryview(raw.data)
        for index in np.flatnonzero(large):
            start = int(offsets[index])
            digest = hashlib.blake2b(view[start:start + int(lengths[index])], digest_size=8)
            hashes[index] = int.from_bytes(digest.digest(), "little")
        hashes[large] = _salted(hashes[large], lengths[large] + 1)
        if large.all():
            return hashes
    small = np.flatnonzero(~large)
    # Runs of small strings that fit in a window; a large string in between is a gap.
    first = 0
    while first < len(small):
        begin = int(offsets[small[first]])
        last = int(np.searchsorted(offsets[small + 1], begin + WINDOW_BYTES, side="right"))
        last = min(max(last, first + 1), len(small))
        chosen = small[first:last]
        contiguous = chosen[-1] - chosen[0] + 1 == len(chosen)
        if contiguous:
            end = int(offsets[chosen[-1] + 1])
            hashes[chosen] = _window(raw[begin:end], offsets[chosen[0]:chosen[-1] + 2] - begin)
        else:  # a large string lies among them: each small one from its own offsets
            sizes = lengths[chosen]
            packed = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes)])
            where = (np.repeat(offsets[chosen] - packed[:-1], sizes)
                     + np.arange(int(packed[-1]), dtype=np.int64))
            hashes[chosen] = _window(raw[where], packed)
        first = last
    return hashes


def _window(raw: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """``_bytes`` for small strings, about a window's bytes of them: one word position
    at a time over the strings that have a word there (at most ``LARGE_BYTES / 8``
    passes, each over arrays of one entry per string)."""
    lengths = np.diff(offsets)
    padded = np.zeros((len(raw) + 23) // 8 * 8, dtype=np.uint8)
    padded[:len(raw)] = raw
    aligned = padded.view("<u8")  # words at any byte offset come from two of these
    starts = offsets[:-1]
    words_per_value = (lengths + 7) >> 3
    sums = np.zeros(len(lengths), dtype=_U64)
    fewest, most = int(words_per_value.min(initial=0)), int(words_per_value.max(initial=0))
    active = np.arange(len(lengths), dtype=np.int64)
    with np.errstate(over="ignore"):
        for position in range(most):
            if position >= fewest:  # some strings have no word here any more
                active = active[words_per_value[active] > position]
            chosen: np.ndarray | slice = active if position >= fewest else slice(None)
            word = _word_at(aligned, starts[chosen] + 8 * position)
            if position >= fewest - 1:  # the last word of some strings
                word &= _tail_mask(lengths[chosen] - 8 * position)
            sums[chosen] += _salted(word, position + 1)
    return _salted(sums, lengths + 1)


def _word_at(aligned: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian 64-bit word at each byte offset ``at``, from two aligned
    words (``aligned`` extends at least a word past every offset)."""
    index, shift = at >> 3, ((at & 7) * 8).astype(_U64)
    with np.errstate(over="ignore"):
        # ``<< 1 << (63 - shift)``: a shift by 64 is not defined, this gives 0 there.
        word: np.ndarray = (aligned[index] >> shift) | ((aligned[index + 1] << _U64(1))
                                                        << (_U64(63) - shift))
    return word


def _tail_mask(left: np.ndarray) -> np.ndarray:
    """The bits of a word that belong to its string, ``left`` bytes of it remaining."""
    whole = left >= 8
    partial = np.clip(left, 0, 7).astype(_U64) * _U64(8)
    return np.where(whole, _ALL_BITS, (_U64(1) << partial) - _U64(1))


def _lists(offsets: np.ndarray, values: pa.Array) -> np.ndarray:
    """The hash of each list: its items' hashes, each mixed with its position in the
    list, summed and mixed with the list's length."""
    start, end = int(offsets[0]), int(offsets[-1])
    items = _values(values.slice(start, end - start))
    offsets = offsets - start
    lengths = np.diff(offsets)
    owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    position = np.arange(end - start, dtype=np.int64) - offsets[:-1][owner]
    return _salted(_segment_sums(_salted(items, position + 1), lengths), lengths + 1)


def _segment_sums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The sum (mod 2**64) of each run of ``lengths[i]`` consecutive values."""
    with np.errstate(over="ignore"):
        running = np.concatenate([np.zeros(1, dtype=_U64), np.cumsum(values, dtype=_U64)])
        ends = np.cumsum(lengths)
        sums: np.ndarray = running[ends] - running[ends - lengths]
    return sums


def _python(array: pa.Array) -> np.ndarray:
    digests = [hashlib.sha256(repr(value).encode()).digest()[:8]
               for value in array.to_pylist()]
    return np.array([int.from_bytes(d, "little") for d in digests], dtype=_U64)


def _is_fixed_width(kind: pa.DataType) -> bool:
    fixed = (pa.types.is_integer(kind) or pa.types.is_floating(kind)
             or pa.types.is_temporal(kind) or pa.types.is_decimal(kind)
             or pa.types.is_interval(kind))
    try:
        width = kind.bit_width
    except ValueError:
        return False
    return bool(fixed and width % 8 == 0 and width >= 8)


__all__ = ["FINGERPRINT_HEX", "Fingerprint", "Written", "fingerprint_of"]
