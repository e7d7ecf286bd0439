"""Spark's JSON text from Arrow (``core/text/sparkjson.py``), without Spark: the cases the
type matrix (integration/connectors/file/test_file_types.py) compares with Spark's own
writer, pinned here so a change shows at once."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest

from sparkeos.core.text.sparkjson import json_lines, json_values


@pytest.mark.parametrize(("value", "text"), [
    (0.1, "0.1"), (100.0, "100.0"), (1e20, "1.0E20"), (1e-5, "1.0E-5"), (1.5e-7, "1.5E-7"),
    (123456789.0, "1.23456789E8"), (-0.0, "-0.0"), (0.0, "0.0"), (9999999.0, "9999999.0"),
    (1e7, "1.0E7"), (0.001, "0.001"), (0.000999, "9.99E-4"), (-1.5, "-1.5"),
    (1.7976931348623157e308, "1.7976931348623157E308"), (2.0 / 3, "0.6666666666666666"),
    (float("nan"), '"NaN"'), (float("inf"), '"Infinity"'), (float("-inf"), '"-Infinity"'),
    (None, None)])
def test_doubles_as_javas_double_to_string(value, text):
    assert json_values(pa.array([value], pa.float64())).to_pylist() == [text]


def test_floats_keep_their_own_shortest_digits():
    values = pa.array([0.1, 3.4028235e38, 1e-7, 16777216.0], pa.float32())
    assert json_values(values).to_pylist() == ["0.1", "3.4028235E38", "1.0E-7", "1.6777216E7"]


def test_every_type_of_a_row():
    batch = pa.RecordBatch.from_pydict({
        "i": pa.array([1, None], pa.int32()),
        "dec": pa.array([decimal.Decimal("12345678901234567890.123456789012345678"),
                         decimal.Decimal("0E-18")], pa.decimal128(38, 18)),
        "s": pa.array(['a"b\\c', "é\n\x01\x1f"]),
        "bin": pa.array([b"\x00\xff", None]),
        "day": pa.array([dt.date(1970, 1, 1), None]),
        "ts": pa.array([dt.datetime(2026, 1, 2, 3, 4, 5, 123456),
                        dt.datetime(1969, 12, 31, 23, 59, 59, 999999)],
                       pa.timestamp("us", tz="UTC")),
        "la": pa.array([dt.datetime(2026, 1, 2, 3, 4, 5), None],
                       pa.timestamp("us", tz="America/Los_Angeles")),
        "ntz": pa.array([dt.datetime(2026, 1, 2, 3, 4, 5, 123456), None], pa.timestamp("us")),
        "ints": pa.array([[1, None, 3], []], pa.list_(pa.int32())),
        "m": pa.array([[("a", 1), ("b", None)], None], pa.map_(pa.string(), pa.int32())),
        "st": pa.array([{"x": 1, "y": None}, None],
                       pa.struct([("x", pa.int64()), ("y", pa.string())])),
        "aos": pa.array([[{"x": 1}], [None, {"x": None}]],
                        pa.list_(pa.struct([("x", pa.int64())]))),
    })
    assert json_lines(batch).decode().splitlines() == [
        '{"i":1,"dec":12345678901234567890.123456789012345678,"s":"a\\"b\\\\c",'
        '"bin":"AP8=","day":"1970-01-01","ts":"2026-01-02T03:04:05.123Z",'
        '"la":"2026-01-01T19:04:05.000-08:00","ntz":"2026-01-02T03:04:05.123",'
        '"ints":[1,null,3],"m":{"a":1,"b":null},"st":{"x":1},"aos":[{"x":1}]}',
        '{"dec":0E-18,"s":"é\\n\\u0001\\u001F","ts":"1969-12-31T23:59:59.999Z",'
        '"ints":[],"aos":[null,{}]}']


def test_a_row_of_nulls_is_an_empty_object_and_slices_keep_their_rows():
    batch = pa.RecordBatch.from_pydict({"a": pa.array([None, 1, None], pa.int64()),
                                        "b": pa.array([None, None, "x"])})
    assert json_lines(batch) == b'{}\n{"a":1}\n{"b":"x"}\n'
    assert json_lines(batch.slice(1, 2)) == b'{"a":1}\n{"b":"x"}\n'
    assert json_lines(batch.slice(0, 0)) == b""


def test_strings_are_escaped_only_where_one_needs_it():
    values = pa.array(["plain", 'a"b', "c\\d", "tab\there", None, "é"])
    assert json_values(values).to_pylist() == [
        '"plain"', '"a\\"b"', '"c\\\\d"', '"tab\\there"', None, '"é"']
    assert json_values(pa.array(["plain", "é", None])).to_pylist() == [
        '"plain"', '"é"', None]
