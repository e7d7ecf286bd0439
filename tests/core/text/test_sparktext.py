"""Spark's text of a value (``core/text/sparktext.py``), without Spark: each rule pinned by
what Spark 4.3 on Java 17 writes (measured; the generated differential tests in
integration/connectors/file/test_generated_text.py compare with Spark itself)."""

from __future__ import annotations

import datetime as dt
import decimal

import numpy as np
import pyarrow as pa
import pytest

from sparkeos.core.errors import ConfigurationError, DataRejectedError
from sparkeos.core.text import sparktext
from sparkeos.core.text.sparkjson import json_values
from sparkeos.core.text.sparktext import (
    SessionText,
    _calendar_text,
    _double_text_general,
    _local_text,
    cast_to_string,
    date_text,
    double_text,
    escape_path_name,
    json_timestamp_text,
    map_key_text,
    partition_names,
    partition_refusal,
    unescape_path_name,
)

ANSI, LEGACY_OFF = SessionText(ansi=True), SessionText(ansi=False)
LA = "America/Los_Angeles"


def micros(*values: int, tz: str | None = LA) -> pa.Array:
    return pa.array(list(values), pa.timestamp("us", tz=tz))


def test_decimals_are_plain_under_ansi_and_java_text_without() -> None:
    values = pa.array([decimal.Decimal(v) for v in ("0E-10", "1E-10", "-1.000E-7", "12.5")]
                      + [None], pa.decimal128(20, 10))
    assert cast_to_string(values, ANSI).to_pylist() == [
        "0.0000000000", "0.0000000001", "-0.0000001000", "12.5000000000", None]
    assert cast_to_string(values, LEGACY_OFF).to_pylist() == [
        "0E-10", "1E-10", "-1.000E-7", "12.5000000000", None]
    whole = pa.array([decimal.Decimal("-12345678901234567890123456789012345678")],
                     pa.decimal128(38, 0))
    assert cast_to_string(whole, ANSI).to_pylist() == ["-12345678901234567890123456789012345678"]
    sliced = pa.array([decimal.Decimal("1.5"), decimal.Decimal("-0.25")],
                      pa.decimal128(3, 2)).slice(1)
    assert cast_to_string(sliced, ANSI).to_pylist() == ["-0.25"]


def test_timestamps_cast_in_the_session_zone_with_its_local_mean_time() -> None:
    values = micros(-3000000000000000, 1500, 300000000000000000, -80000000000000000,
                    2500000000000000)
    # Spark 4.3 (Java 17), session zone America/Los_Angeles: measured.
    assert cast_to_string(values, ANSI).to_pylist() == [
        "1874-12-07 10:47:02", "1969-12-31 16:00:00.0015", "+11476-08-14 22:20:00",
        "-0566-11-25 17:53:42", "2049-03-21 21:26:40"]
    assert json_timestamp_text(values, ANSI).to_pylist() == [
        "1874-12-07T10:47:02.000-07:52:58", "1969-12-31T16:00:00.001-08:00",
        "+11476-08-14T22:20:00.000-07:00", "-0566-11-25T17:53:42.000-07:52:58",
        "2049-03-21T21:26:40.000-07:00"]
    ntz = micros(1704067200500000, 300000000000000000, tz=None)
    assert cast_to_string(ntz, ANSI).to_pylist() == ["2024-01-01 00:00:00.5",
                                                     "+11476-08-15 05:20:00"]
    assert json_timestamp_text(ntz, ANSI).to_pylist() == ["2024-01-01T00:00:00.500",
                                                          "+11476-08-15T05:20:00.000"]


def test_dates_have_javas_years() -> None:
    days = pa.array([3000000, -800000, -719528, 0, None], pa.date32())
    assert date_text(days, ANSI).to_pylist() == [
        "+10183-09-21", "-0221-09-04", "0000-01-01", "1970-01-01", None]


def test_the_fast_and_the_general_path_agree() -> None:
    """Arrow's text where years have four digits, the civil calendar elsewhere: the
    same text where both apply."""
    rng = np.random.default_rng(48)
    days = rng.integers(-719162, 2932896, 3000)
    assert _calendar_text(days).to_pylist() == pa.array(
        days.astype(np.int32), pa.date32()).cast(pa.string()).to_pylist()
    local = rng.integers(-62135596800000000, 253402300799999999, 3000)
    arrow = _local_text(local, "us").to_pylist()
    beyond = np.append(local, 253402300800000000)  # one value in year 10000
    general = _local_text(beyond, "us").to_pylist()
    assert general[:-1] == arrow and general[-1] == "+10000-01-01 00:00:00.000000"


def test_the_legacy_calendar_is_refused_where_dates_are_written() -> None:
    legacy = SessionText(time_parser_policy="LEGACY")
    with pytest.raises(ConfigurationError, match="timeParserPolicy"):
        date_text(pa.array([0], pa.date32()), legacy)
    assert cast_to_string(pa.array([1]), legacy).to_pylist() == ["1"]


def test_partition_names_escape_and_default() -> None:
    values = pa.array([b"a/b", b"", None, b"\xffz", "é #?".encode()])
    assert partition_names("_day x", values, ANSI) == [
        "_day x=a%2Fb", "_day x=__HIVE_DEFAULT_PARTITION__",
        "_day x=__HIVE_DEFAULT_PARTITION__", "_day x=\ufffdz", "_day x=é %23%3F"]
    with pytest.raises(DataRejectedError, match="NUL"):
        partition_names("s", pa.array(["a\x00b"]), ANSI)
    assert escape_path_name("a/b=c:d%e") == "a%2Fb%3Dc%3Ad%25e"
    for text in ("a/b=c:d%e", "100%", "%zz", "x%4"):
        assert unescape_path_name(escape_path_name(text)) == text


def test_floating_point_and_intervals_are_refused_as_partitions() -> None:
    assert "Java 17" in (partition_refusal(pa.float64()) or "")
    assert "fields" in (partition_refusal(pa.duration("us")) or "")
    assert partition_refusal(pa.timestamp("us", "UTC")) is None


def test_map_keys_are_the_internal_values_text() -> None:
    assert map_key_text(pa.array([19000], pa.date32())).to_pylist() == ["19000"]
    assert map_key_text(micros(1500)).to_pylist() == ["1500"]
    assert map_key_text(pa.array([decimal.Decimal("1E-10")],
                                 pa.decimal128(20, 10))).to_pylist() == ["1E-10"]
    assert map_key_text(pa.array([0.1], pa.float32())).to_pylist() == ["0.1"]
    with pytest.raises(ConfigurationError, match="identity"):
        map_key_text(pa.array([b"\x00"]))
    line = json_values(pa.array([[(dt.date(2022, 1, 8), 1)]],
                                pa.map_(pa.date32(), pa.int32()))).to_pylist()
    assert line == ['{"19000":1}']


@pytest.mark.parametrize("float_type", [pa.float64(), pa.float32()])
def test_the_plain_range_shortcut_writes_what_the_general_path_writes(
        float_type: pa.DataType) -> None:
    """Values in Java's plain range take a shortcut (``double_text``); mixed with values
    outside it, NaN, infinities and nulls in one array, every value's text is the
    general path's."""
    rng = np.random.default_rng(36)
    values = rng.random(4000) * 10.0 ** rng.integers(-12, 13, 4000)
    values[::3] *= -1
    edges = [0.0, -0.0, 1e-3, -1e-3, 9.99e-4, 1e7, 9999999.0, 1e7 - 0.5, 5.0, 0.1,
             float("nan"), float("inf"), float("-inf")]
    array = pa.array([*values, *edges, None], float_type)
    assert double_text(array).to_pylist() == _double_text_general(array).to_pylist()
    plain_only = array.filter(pa.array([v is not None and 1e-3 <= abs(v) < 1e7
                                        for v in array.to_pylist()]))
    assert double_text(plain_only).to_pylist() == _double_text_general(plain_only).to_pylist()


def test_json_offsets_without_seconds_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """``spark.sql.files.supportSecondOffsetFormat=false``: Spark writes ``-07:52`` for
    Los Angeles' local mean time; sparkeos refuses rather than write other bytes."""
    props = {"spark.sql.files.supportSecondOffsetFormat": "false"}
    monkeypatch.setattr(sparktext, "task_property", props.get)
    values = pa.array([-3000000000000000], pa.timestamp("us", tz="America/Los_Angeles"))
    with pytest.raises(ConfigurationError, match="supportSecondOffsetFormat"):
        json_timestamp_text(values)
    naive = pa.array([-3000000000000000], pa.timestamp("us"))
    assert json_timestamp_text(naive).to_pylist() == ["1874-12-07T18:40:00.000"]
