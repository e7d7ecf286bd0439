"""``core.snapshot.fingerprint``: the same rows give the same fingerprint however Spark cut them
into Arrow batches and in whatever order they come (a shuffle upstream of a replay);
any other content, a row more or a row less, gives another."""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pyarrow as pa
import pytest

from sparkeos.core.snapshot.fingerprint import Fingerprint, Written, fingerprint_of


def every_kind() -> pa.Table:
    return pa.table({
        "i": pa.array([1, None, 3, 4, 5], pa.int64()),
        "s": pa.array(["a", None, "ccc", "", "é"]),
        "b": pa.array([True, None, False, True, False]),
        "d": pa.array([decimal.Decimal("1.5"), None, decimal.Decimal("-2.25"),
                       decimal.Decimal("0"), decimal.Decimal("9")], pa.decimal128(10, 2)),
        "ts": pa.array([datetime.datetime(2020, 1, 1), None, datetime.datetime(2021, 1, 1),
                        datetime.datetime(2022, 1, 1), datetime.datetime(2023, 1, 1)],
                       pa.timestamp("us", tz="UTC")),
        "l": pa.array([[1, 2], None, [], [3], [None]], pa.list_(pa.int32())),
        "m": pa.array([{"a": 1}, None, {}, {"b": 2}, {"c": None}],
                      pa.map_(pa.string(), pa.int32())),
        "st": pa.array([{"x": 1, "y": "a"}, None, {"x": None, "y": "c"}, {"x": 4, "y": None},
                        {"x": 5, "y": "e"}]),
        "bin": pa.array([b"\x00", None, b"zz", b"", b"q"]),
        "fl": pa.array([[1, 2], None, [3, 4], [5, 6], [7, 8]], pa.list_(pa.int8(), 2)),
        "n": pa.nulls(5),
    })


def test_the_same_rows_cut_into_any_batches_give_one_fingerprint() -> None:
    table = every_kind()
    whole = fingerprint_of(*table.to_batches())
    for cut in range(len(table) + 1):
        fingerprint = Fingerprint()
        fingerprint.update(table.slice(0, cut))
        fingerprint.update(table.slice(cut))
        assert fingerprint.written() == whole, f"cut at {cut}"
    assert whole.rows == 5 and len(whole.fingerprint) == 32


@pytest.mark.parametrize("column, values", [
    ("s", pa.array(["a", None, "ccd", "", "é"])),
    ("s", pa.array(["a", "", "ccc", "", "é"])),  # a null is not an empty string
    ("l", pa.array([[1, 2], None, [3], [], [None]], pa.list_(pa.int32()))),
    ("m", pa.array([{"a": 1}, None, {}, {"b": 3}, {"c": None}],
                   pa.map_(pa.string(), pa.int32()))),
    ("st", pa.array([{"x": 1, "y": "a"}, None, {"x": None, "y": "c"}, {"x": 4, "y": None},
                     {"x": 5, "y": "f"}])),
    ("b", pa.array([True, False, False, True, False])),
    ("fl", pa.array([[1, 2], None, [3, 4], [5, 6], [7, 9]], pa.list_(pa.int8(), 2))),
])
def test_any_other_value_gives_another_fingerprint(column: str, values: pa.Array) -> None:
    table = every_kind()
    changed = table.set_column(table.schema.get_field_index(column), column, values)
    assert fingerprint_of(*changed.to_batches()) != fingerprint_of(*table.to_batches())


def test_another_order_is_the_same_fingerprint() -> None:
    table = every_kind()
    whole = fingerprint_of(*table.to_batches())
    for order in ([4, 3, 2, 1, 0], [2, 0, 4, 1, 3]):
        shuffled = table.take(pa.array(order))
        assert fingerprint_of(*shuffled.to_batches()) == whole, order
        fingerprint = Fingerprint()  # and cut anywhere, fed in pieces
        fingerprint.update(shuffled.slice(3))
        fingerprint.update(shuffled.slice(0, 3))
        assert fingerprint.written() == whole, order


def test_a_row_more_or_less_is_another_fingerprint() -> None:
    """A multiset: a repeated row counts each time, a missing one is missed."""
    table = every_kind()
    whole = fingerprint_of(table)
    assert fingerprint_of(table.take(pa.array([0, 1, 2, 3]))) != whole
    doubled = table.take(pa.array([0, 0, 1, 2, 3, 4]))
    swapped = table.take(pa.array([0, 1, 1, 2, 3, 4]))
    assert len({fingerprint_of(doubled), fingerprint_of(swapped), whole}) == 3


def test_values_moved_between_rows_or_columns_are_other_rows() -> None:
    """Order does not count across rows, but it does within a row, a string, a list."""
    base = pa.table({"a": ["x", "y"], "b": ["1", "2"]})
    moved_across_rows = pa.table({"a": ["x", "y"], "b": ["2", "1"]})
    swapped_columns = pa.table({"a": ["1", "2"], "b": ["x", "y"]})
    assert len({fingerprint_of(t) for t in (base, moved_across_rows, swapped_columns)}) == 3
    words = pa.table({"s": ["abcdefgh-ijklmnop", "ijklmnop-abcdefgh", "bacdefgh-ijklmnop"]})
    assert len({fingerprint_of(words.slice(i, 1)) for i in range(3)}) == 3
    lists = pa.table({"l": pa.array([[1, 2], [2, 1]], pa.list_(pa.int64()))})
    assert fingerprint_of(lists.slice(0, 1)) != fingerprint_of(lists.slice(1, 1))


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 63, 64, 65, 500, 1023, 1024, 3000])
def test_a_string_hashes_alike_wherever_it_sits(length: int) -> None:
    """A string's hash depends on the string alone: not on its byte offset in the data
    buffer (modulo a word), nor on its neighbours' lengths (small strings are hashed a
    word position at a time over a window, large ones one by one); one byte changed at
    its end changes it."""
    text = "".join(chr(0x61 + (i * 7) % 26) for i in range(length))
    alone = fingerprint_of(pa.table({"s": [text]}))
    for prefix in ("", "é", "abc", "x" * 2000):
        column = pa.array([prefix, text, "tail" * 300]).slice(1, 1)
        assert fingerprint_of(pa.table({"s": column})) == alone, (length, len(prefix))
    if length:
        changed = text[:-1] + ("z" if text[-1] != "z" else "y")
        assert fingerprint_of(pa.table({"s": [changed]})) != alone


def test_sliced_nested_arrays_hash_their_own_values() -> None:
    table = every_kind()
    for start in range(len(table)):
        part = table.slice(start, 2)
        rebuilt = pa.Table.from_pylist(part.to_pylist(), schema=table.schema)
        assert fingerprint_of(part) == fingerprint_of(rebuilt), start


def test_many_rows_in_any_order() -> None:
    """The same multiset from a shuffled batch of many rows (cut into chunks inside)."""
    count = 100_000
    rng = np.random.default_rng(7)
    table = pa.table({"id": np.arange(count), "text": pa.array(
        [f"row-{i}" for i in range(count)])})
    order = pa.array(rng.permutation(count))
    assert fingerprint_of(table) == fingerprint_of(table.take(order))


def test_what_lies_under_a_null_is_not_content() -> None:
    values = pa.py_buffer(np.array([1, 99, 3], dtype=np.int64).tobytes())
    validity = pa.array([True, False, True]).buffers()[1]
    garbage = pa.Array.from_buffers(pa.int64(), 3, [validity, values])
    clean = pa.array([1, None, 3], pa.int64())
    assert (fingerprint_of(pa.record_batch([garbage], ["i"]))
            == fingerprint_of(pa.record_batch([clean], ["i"])))


def test_string_layouts_of_the_same_text_agree() -> None:
    table = every_kind()
    for kind in (pa.large_string(), pa.string_view()):
        other = table.set_column(1, "s", table.column("s").cast(kind))
        assert fingerprint_of(*other.to_batches()) == fingerprint_of(*table.to_batches())


def test_only_a_known_equal_record_is_the_same() -> None:
    written = Written(3, "ab" * 16)
    assert written.same_as(Written(3, "ab" * 16))
    assert not written.same_as(None), "a marker without a fingerprint never matches"
    assert not written.same_as(Written(4, "ab" * 16))
    assert Written.from_json({"rows": 3}) is None
    assert Written.from_json(written.as_json()) == written


def test_values_hash_alike_in_any_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small and large values mixed, taken a window of bytes at a time or all at once:
    each value hashes the same (the windows only bound numpy's temporaries), and the
    same value sliced out alone too."""
    import sparkeos.core.snapshot.fingerprint as module

    rng = np.random.default_rng(3)
    values = [bytes(rng.integers(0, 256, size=n, dtype=np.uint8))
              for n in (0, 5, 64, 65, 200, 4096, 70_000, 9, 300, 1023, 1024, 12)]
    column = pa.array(values, pa.binary())
    table = pa.table({"b": column})
    whole = fingerprint_of(table)
    alone = [module._values(column.slice(i, 1))[0] for i in range(len(values))]
    assert list(module._values(column)) == alone
    for window in (8, 64, 1000, 65_536):
        monkeypatch.setattr(module, "WINDOW_BYTES", window)
        assert fingerprint_of(table) == whole, window
        changed = [*values[:6], values[6][:-1] + b"?", *values[7:]]
        assert fingerprint_of(pa.table({"b": pa.array(changed, pa.binary())})) != whole


def test_an_empty_participant_is_one_whatever_it_was_fed() -> None:
    fed = Fingerprint()
    fed.update(every_kind().slice(0, 0))
    assert fed.written() == Fingerprint().written()
