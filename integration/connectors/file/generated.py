"""What the generated differential tests draw (hypothesis strategies of Spark types and
their values, the budget and seed) and how they set a session's settings for a case:
shared by ``test_generated_text.py`` (partition directories, JSON lines) and
``test_generated_parquet.py`` (Parquet).

``SPARKEOS_GENERATED_EXAMPLES`` cases per test (default 2, ``./run generated``: 100)
from the fixed seed ``SPARKEOS_GENERATED_SEED`` (default 48).
"""

from __future__ import annotations

import dataclasses
import decimal
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("SPARKEOS_GENERATED_EXAMPLES", "2"))
SEED = int(os.environ.get("SPARKEOS_GENERATED_SEED", "48"))
ZONES = ("America/Los_Angeles", "Europe/Amsterdam", "Africa/Monrovia", "Asia/Kathmandu",
         "Pacific/Apia", "Australia/Lord_Howe", "Europe/Dublin", "America/Sao_Paulo",
         "+05:45", "-13:33:33", "GMT+8", "PST", "Etc/GMT-14", "UTC")
"""Session time zones: local mean times with seconds (Los Angeles -07:52:58 before 1883,
Monrovia -00:43:08, Kathmandu +05:41:16), a merged zone (Amsterdam: Brussels' history
in IANA's main data and Java's), a skipped day (Apia 2011), half-hour and negative
daylight saving (Lord Howe, Dublin), fixed offsets with seconds, Java's short IDs."""

YEAR_US = 365_2425 * 86_400 * 100  # microseconds in a mean Gregorian year
LMT_END_LA = -2717640000 * 1_000_000  # 1883-11-18T20:00:00Z, Los Angeles' standard time
MICROS = st.one_of(
    st.integers(-170 * YEAR_US, 130 * YEAR_US),  # 1800 .. 2100
    st.integers(-2970 * YEAR_US, 9030 * YEAR_US),  # years -1000 .. 11000
    st.integers(-190_000 * YEAR_US, 190_000 * YEAR_US),  # far: six-digit years
    st.integers(LMT_END_LA - 3_600_000_000, LMT_END_LA + 3_600_000_000),
    st.sampled_from([0, -1, 1, 999, 1_000_000, 253402300799999999, 253402300800000000,
                     -62135596800000000, -62135596800000001]))
DAYS = st.one_of(st.integers(-62_000, 47_000), st.integers(-1_085_000, 3_300_000),
                 st.integers(-70_000_000, 70_000_000),
                 st.sampled_from([0, -1, 2932896, 2932897, -719162, -719163, -719528]))
TEXT = st.text(st.one_of(st.sampled_from(list('/=%#? _:\\"\'*{[]^.\x01\x1f\x7fé字😀aZ0-')),
                         st.characters(blacklist_categories=("Cs",),
                                       blacklist_characters="\x00")), max_size=6)


@dataclass(frozen=True)
class Kind:
    """A Spark type: its DDL, its Arrow type for the source file, and its values."""

    ddl: str
    arrow: pa.DataType = dataclasses.field(repr=False)
    values: st.SearchStrategy[Any] = dataclasses.field(repr=False)
    floating: str = dataclasses.field(default="", repr=False)
    """``float`` or ``double`` for the floating-point types (the named difference)."""


def _decimal_kind(precision: int, scale: int) -> Kind:
    top = 10 ** precision - 1
    unscaled = st.one_of(st.sampled_from([0, 1, -1, top, -top]), st.integers(-top, top),
                         st.integers(-999, 999).filter(lambda u: abs(u) <= top))
    return Kind(f"decimal({precision},{scale})", pa.decimal128(precision, scale),
                unscaled.map(lambda u: decimal.Decimal(f"{u}E-{scale}")))


def _integer_kind(ddl: str, bits: int, arrow: pa.DataType) -> Kind:
    low, high = -2 ** (bits - 1), 2 ** (bits - 1) - 1
    return Kind(ddl, arrow, st.one_of(st.sampled_from([low, high, 0, -1]),
                                      st.integers(low, high)))


_SCALARS: dict[str, Kind] = {
    "boolean": Kind("boolean", pa.bool_(), st.booleans()),
    "tinyint": _integer_kind("tinyint", 8, pa.int8()),
    "smallint": _integer_kind("smallint", 16, pa.int16()),
    "int": _integer_kind("int", 32, pa.int32()),
    "bigint": _integer_kind("bigint", 64, pa.int64()),
    "date": Kind("date", pa.date32(), DAYS),
    "timestamp": Kind("timestamp", pa.timestamp("us", tz="UTC"), MICROS),
    "timestamp_ntz": Kind("timestamp_ntz", pa.timestamp("us"), MICROS),
    "string": Kind("string", pa.string(), TEXT),
    # As a partition: no NUL (no directory name holds it; Spark fails too), and not
    # empty: Spark's writer fails on a batch holding both null and empty binary values
    # (its Empty2Null covers strings only, so both open the same file; docs/formats.md).
    "binary": Kind("binary", pa.binary(), st.binary(min_size=1, max_size=5).filter(
        lambda b: b"\x00" not in b)),
    "float": Kind("float", pa.float32(), st.one_of(
        st.floats(width=32), st.sampled_from([-0.0, 0.1, 3.4028235e38, 1e-45])), "float"),
    "double": Kind("double", pa.float64(), st.one_of(
        st.floats(), st.sampled_from([-0.0, 1e23, 4.9e-324, 2e-3, 1e7, 1e-3])), "double"),
}
PARTITION_TYPES = ("decimal", "timestamp", "date", "string", "binary", "timestamp_ntz",
                   "decimal", "timestamp", "date", "string", "boolean", "tinyint", "smallint",
                   "int", "bigint")
"""Every type Spark's partitionBy takes and sparkeos writes (floating point and intervals
are refused: docs/formats.md); the hard ones twice, and first (hypothesis draws the first
of a permutation more often)."""
KEY_TYPES = ("string", "tinyint", "int", "bigint", "boolean", "date", "timestamp",
             "timestamp_ntz", "float", "double", "decimal")
"""Every map key type whose JSON text Spark writes as a value's toString a reader can use
(binary, array and struct keys are refused)."""


@st.composite
def scalar_kind(draw: st.DrawFn, name: str, partition: bool = False) -> Kind:
    if name == "decimal":
        precision = draw(st.integers(1, 38))
        return _decimal_kind(precision, draw(st.integers(0, precision)))
    kind = _SCALARS[name]
    if name == "binary" and not partition:  # a NUL byte is fine in JSON
        return Kind(kind.ddl, kind.arrow, st.binary(max_size=5))
    return kind


@st.composite
def nested_kind(draw: st.DrawFn, depth: int = 0) -> Kind:
    """An array, map or struct of scalars and of nested types, two levels deep."""
    shapes = ["array", "map", "struct"] + (["scalar"] * 2 if depth else [])
    shape = draw(st.permutations(shapes))[0]
    if shape == "scalar" or depth >= 2:
        return draw(scalar_kind(draw(st.permutations([*_SCALARS, "decimal"]))[0]))
    if shape == "array":
        item = draw(nested_kind(depth + 1))
        return Kind(f"array<{item.ddl}>", pa.list_(item.arrow),
                    st.lists(_nullable(item.values), max_size=3), item.floating)
    if shape == "map":
        return draw(map_kind(draw(st.permutations(KEY_TYPES))[0], depth + 1))
    first, second = draw(nested_kind(depth + 1)), draw(nested_kind(depth + 1))
    return Kind(f"struct<a:{first.ddl},b:{second.ddl}>",
                pa.struct([("a", first.arrow), ("b", second.arrow)]),
                st.fixed_dictionaries({"a": _nullable(first.values),
                                       "b": _nullable(second.values)}),
                first.floating or second.floating)


@st.composite
def map_kind(draw: st.DrawFn, key_type: str, depth: int) -> Kind:
    key = draw(scalar_kind(key_type))
    keys = key.values.filter(lambda k: k == k)  # a NaN key is never equal to itself
    value = draw(nested_kind(depth))
    pairs = st.dictionaries(keys, _nullable(value.values), max_size=3).map(
        lambda d: list(d.items()))
    return Kind(f"map<{key.ddl},{value.ddl}>", pa.map_(key.arrow, value.arrow), pairs,
                key.floating or value.floating)


def _nullable(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(values, values, values, st.none())



@contextmanager
def session_settings(spark: Any, values: dict[str, str]) -> Iterator[None]:
    before = {key: spark.conf.get(key, None) for key in values}
    for key, value in values.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
