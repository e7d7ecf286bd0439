"""``core.fingerprint``: the same rows give the same fingerprint however Spark cut them
into Arrow batches; any other content, or another order, gives another."""

from __future__ import annotations

import datetime
import decimal

import numpy as np
import pyarrow as pa
import pytest

from sparkeos.core.fingerprint import Fingerprint, Written, fingerprint_of


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


def test_another_order_is_another_fingerprint() -> None:
    table = every_kind()
    reversed_rows = table.take(pa.array([4, 3, 2, 1, 0]))
    assert fingerprint_of(*reversed_rows.to_batches()) != fingerprint_of(*table.to_batches())


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
