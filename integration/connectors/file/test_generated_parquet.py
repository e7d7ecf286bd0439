"""Parquet as Spark writes it, from Spark, on generated cases: hypothesis draws a schema
(every Spark type Parquet stores: integers of each width, float and double with NaN and
-0.0, decimals of every precision, strings plain and collated, binary, boolean, date,
timestamps and timestamp_ntz before year 1000 and after 9999, day-time intervals;
arrays, maps and structs nested two deep; required and optional fields and elements;
field IDs and comments) and rows, under each set of the Spark settings that change the
files (``SETTINGS``). One Spark run per case writes the same rows three ways:

* ``df.write.parquet(...)``: Spark's own writer;
* ``writeStream.format("sparkeos-parquet")``: the format learns the settings from
  ``sparkeos.register(spark)``, from options of the same names, or not at all where
  they are Spark's defaults;
* ``writeStream.foreachBatch(exactly_once(FileSink(...)))``: the sink reads them from
  the session.

Every part file must have Spark's physical schema (pyarrow's view: names, physical,
logical and converted types, repetition, field IDs; and the footer's schema elements
themselves), Spark's key-value metadata, Spark's codec and Spark's name for it; and
Spark must read back the same values, value for value. docs/formats.md names what
still differs (``created_by``, row groups, encodings, statistics).

``./run test`` draws ``SPARKEOS_GENERATED_EXAMPLES`` cases (default 2) for each set of
settings from the fixed seed ``SPARKEOS_GENERATED_SEED`` (default 48), as the generated
text tests do; ``./run generated`` draws more.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from pyspark.sql import types as T

import sparkeos
from sparkeos import exactly_once
from sparkeos.connectors.file import FileSink, committed_files
from sparkeos.connectors.file import parquet_footer as footer
from sparkeos.connectors.file.parquet_schema import FIELD_ID_KEY
from sparkeos.connectors.file.parquet_settings import (
    CODEC,
    FIELD_IDS,
    LEGACY_FORMAT,
    TIMESTAMP_TYPE,
)
from sparkeos.formats import format_classes

from .generated import _SCALARS, EXAMPLES, SEED, _decimal_kind, session_settings

SETTINGS = {
    "defaults": ({}, "none"),
    "micros-legacy-gzip": ({TIMESTAMP_TYPE: "TIMESTAMP_MICROS", LEGACY_FORMAT: "true",
                            CODEC: "gzip"}, "register"),
    "millis-zstd-no-field-ids": ({TIMESTAMP_TYPE: "TIMESTAMP_MILLIS", CODEC: "zstd",
                                  FIELD_IDS: "false"}, "options"),
    "int96-legacy-uncompressed": ({LEGACY_FORMAT: "true", CODEC: "uncompressed"},
                                  "register"),
    "lz4-raw": ({TIMESTAMP_TYPE: "TIMESTAMP_MICROS", CODEC: "lz4_raw"}, "options"),
}
"""Session settings of Spark's Parquet writer, and how the format is told them: not at
all (Spark's defaults), by ``sparkeos.register(spark)`` or by options."""
READ_WITHOUT_IDS = "spark.sql.parquet.fieldId.read.ignoreMissing"
NAMES = ("v", "w x", "ü", "é字", "_v", "Ab")
"""Column and field names (no dots: pyspark's mapInArrow cannot name such a column)."""
ID_FIELD = T.StructField("id", T.LongType(), False)


@dataclass(frozen=True)
class Kind:
    """A Spark type, its Arrow type for the source file, and its values (never null
    where the type says so)."""

    spark: T.DataType
    arrow: pa.DataType
    values: st.SearchStrategy[Any]


_SPARK_SCALARS = {"boolean": T.BooleanType(), "tinyint": T.ByteType(),
                  "smallint": T.ShortType(), "int": T.IntegerType(), "bigint": T.LongType(),
                  "float": T.FloatType(), "double": T.DoubleType(), "date": T.DateType(),
                  "timestamp": T.TimestampType(), "timestamp_ntz": T.TimestampNTZType(),
                  "string": T.StringType(), "binary": T.BinaryType()}


def _or_null(values: st.SearchStrategy[Any], nullable: bool) -> st.SearchStrategy[Any]:
    return st.one_of(values, values, values, st.none()) if nullable else values


@st.composite
def kinds(draw: st.DrawFn, depth: int = 0, key: bool = False) -> Kind:
    """A type nested ``depth`` deep already (two at most); a ``key`` of a map is a
    scalar, never a collated string (Spark refuses those)."""
    shape = draw(st.sampled_from(["scalar"] * 4 + (["array", "map", "struct"]
                                                   if depth < 2 and not key else [])))
    if shape == "scalar":
        name = draw(st.sampled_from([*_SPARK_SCALARS, "decimal", "decimal", "interval",
                                     *([] if key else ["collated"])]))
        if name == "decimal":
            precision = draw(st.integers(1, 38))
            scale = draw(st.integers(0, precision))
            made = _decimal_kind(precision, scale)
            return Kind(T.DecimalType(precision, scale), made.arrow, made.values)
        if name == "collated":
            return Kind(T.StringType("UTF8_LCASE"), pa.string(), _SCALARS["string"].values)
        if name == "interval":
            return Kind(T.DayTimeIntervalType(0, 3), pa.duration("us"),
                        _SCALARS["bigint"].values)
        made = _SCALARS[name]
        values = st.binary(max_size=5) if name == "binary" else made.values
        return Kind(_SPARK_SCALARS[name], made.arrow, values)
    if shape == "array":
        item, nulls = draw(kinds(depth + 1)), draw(st.booleans())
        return Kind(T.ArrayType(item.spark, nulls),
                    pa.list_(pa.field("element", item.arrow, nulls)),
                    st.lists(_or_null(item.values, nulls), max_size=3))
    if shape == "map":
        keys = draw(kinds(depth + 1, key=True))
        value, nulls = draw(kinds(depth + 1)), draw(st.booleans())
        pairs = st.dictionaries(keys.values.filter(lambda k: k == k),  # NaN is no key
                                _or_null(value.values, nulls), max_size=3)
        return Kind(T.MapType(keys.spark, value.spark, nulls),
                    pa.map_(pa.field("key", keys.arrow, False),
                            pa.field("value", value.arrow, nulls)),
                    pairs.map(lambda d: list(d.items())))
    fields = draw(st.lists(st.tuples(st.sampled_from(NAMES), kinds(depth + 1), st.booleans(),
                                     field_metadata()),
                           min_size=1, max_size=3, unique_by=lambda f: f[0]))
    return Kind(T.StructType([T.StructField(n, k.spark, nulls, meta)
                              for n, k, nulls, meta in fields]),
                pa.struct([pa.field(n, k.arrow, nulls) for n, k, nulls, _ in fields]),
                st.fixed_dictionaries({n: _or_null(k.values, nulls)
                                       for n, k, nulls, _ in fields}))


def field_metadata() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(st.just({}), st.just({}), st.builds(
        lambda i: {FIELD_ID_KEY: i}, st.integers(1, 2 ** 31 - 1)),
        st.builds(lambda c: {"comment": c}, st.text(max_size=4)))


@dataclass
class Case:
    schema: T.StructType
    table: pa.Table


@st.composite
def cases(draw: st.DrawFn) -> Case:
    rows = draw(st.integers(1, 30))
    fields = [ID_FIELD]
    columns: dict[str, list[Any]] = {"id": list(range(rows))}
    arrow = [pa.field("id", pa.int64(), False)]
    for index, base in enumerate(draw(st.lists(st.sampled_from(NAMES), min_size=1,
                                               max_size=6))):
        name, kind, nulls = f"{base}{index}", draw(kinds()), draw(st.booleans())
        fields.append(T.StructField(name, kind.spark, nulls, draw(field_metadata())))
        arrow.append(pa.field(name, kind.arrow, nulls))
        columns[name] = draw(st.lists(_or_null(kind.values, nulls), min_size=rows,
                                      max_size=rows))
    schema = pa.schema(arrow)
    table = pa.table([pa.array(columns[f.name], f.type) for f in schema], schema=schema)
    return Case(T.StructType(fields), table)


@pytest.fixture
def told(spark: Any, request: Any) -> Iterator[tuple[dict[str, str], str]]:
    """The settings of the case, set in the session (and registered with the formats
    where the case says so); the registrations are Spark's plain ones again after."""
    values, how = SETTINGS[request.param]
    # Spark refuses to read a file without field IDs with a schema that has them (the
    # source file; its own files written with fieldId.write.enabled=false), unless told.
    with session_settings(spark, {**values, READ_WITHOUT_IDS: "true"}):
        if how == "register":
            sparkeos.register(spark)
        try:
            yield values, how
        finally:
            if how == "register":
                for cls in format_classes():
                    spark.dataSource.register(cls)


@pytest.mark.parametrize("told", list(SETTINGS), indirect=True)
@seed(SEED)
@settings(max_examples=EXAMPLES, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.large_base_example,
                                 HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_parquet_files_are_sparks(spark: Any, tmp_path_factory: Any,
                                  told: tuple[dict[str, str], str], case: Case) -> None:
    values, how = told
    root = str(tmp_path_factory.mktemp("parquet"))
    source = os.path.join(root, "in")
    os.makedirs(source)
    pq.write_table(case.table, os.path.join(source, "part-0.parquet"))
    outputs = {name: os.path.join(root, name) for name in ("spark", "format", "foreach")}
    # Spark reads a file source's columns as nullable: an identity mapInArrow gives the
    # rows the schema drawn.
    def drawn(frame: Any) -> Any:
        return frame.mapInArrow(lambda batches: batches, case.schema)

    stream = drawn(spark.readStream.schema(case.schema).parquet(source))
    writer = stream.writeStream.format("sparkeos-parquet").option("path", outputs["format"])
    if how == "options":
        for key, value in values.items():
            writer = writer.option(key, value)
    queries = [
        writer.option("checkpointLocation", os.path.join(root, "ckpt-format"))
        .trigger(availableNow=True).start(),
        stream.writeStream.foreachBatch(exactly_once(FileSink(outputs["foreach"]),
                                                     name="generated"))
        .option("checkpointLocation", os.path.join(root, "ckpt-foreach"))
        .trigger(availableNow=True).start()]
    drawn(spark.read.schema(case.schema).parquet(source)).coalesce(1).write.parquet(
        outputs["spark"])
    for query in queries:
        query.awaitTermination()

    [theirs] = glob.glob(os.path.join(outputs["spark"], "part-*.parquet"))
    expected = _physical(theirs)
    values_read = _values(spark, outputs["spark"])
    assert len(values_read[1]) == case.table.num_rows
    for route in ("format", "foreach"):
        files = committed_files(outputs[route])
        where = f"{route} route, settings {values}, schema {case.schema.simpleString()}"
        assert files, where
        for file in files:
            assert _physical(file) == expected, where
        assert _values(spark, outputs[route]) == values_read, where


def _physical(path: str) -> dict[str, Any]:
    """What a Parquet file says about its columns, as pyarrow reads it, and its footer's
    own schema elements."""
    parquet = pq.ParquetFile(path)
    meta = parquet.metadata
    columns = [(c.path, c.physical_type, str(c.logical_type), c.converted_type,
                c.max_definition_level, c.max_repetition_level, c.length, c.precision,
                c.scale) for c in parquet.schema]
    name = os.path.basename(path)
    return {
        "schema": str(parquet.schema).split("\n", 1)[1], "columns": columns,
        "key_value": meta.metadata,
        "codecs": {meta.row_group(g).column(c).compression
                   for g in range(meta.num_row_groups) for c in range(meta.num_columns)},
        "extension": name[name.index("."):],
        "elements": footer.get(footer.read_footer(path)[0], 2),
        "version": meta.format_version,
    }


def _values(spark: Any, path: str) -> tuple[str, list[Any]]:
    """What Spark reads back: its schema, and the rows (by id) with every value in a
    form that compares exactly (timestamps as microseconds, floats by their text)."""
    frame = spark.read.parquet(path)
    table = frame.toArrow()
    table = table.cast(pa.schema([pa.field(f.name, _comparable(f.type), f.nullable)
                                  for f in table.schema]))
    rows = sorted((_exact(row) for row in table.to_pylist()), key=lambda r: r["id"])
    return frame.schema.json(), rows


def _comparable(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(kind) or pa.types.is_duration(kind):
        return pa.int64()
    if pa.types.is_date(kind):
        return pa.int32()
    if pa.types.is_map(kind):
        return pa.map_(pa.field("key", _comparable(kind.key_type), False),
                       pa.field("value", _comparable(kind.item_type),
                                kind.item_field.nullable))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(pa.field(kind.value_field.name, _comparable(kind.value_type),
                                 kind.value_field.nullable))
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _comparable(f.type), f.nullable) for f in kind])
    return kind


def _exact(value: Any) -> Any:
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else repr(value)
    if isinstance(value, dict):
        return {key: _exact(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_exact(item) for item in value]
    return value


def test_a_format_never_told_the_sessions_settings_writes_nothing(spark: Any,
                                                                 tmp_path: Any) -> None:
    """A format Spark discovered by itself is given no session settings; its tasks see
    the query's, and refuse to write files other than Spark's writer would write."""
    source, out = str(tmp_path / "in"), str(tmp_path / "out")
    os.makedirs(source)
    pq.write_table(pa.table({"at": pa.array([1], pa.timestamp("us", tz="UTC"))}),
                   os.path.join(source, "part-0.parquet"))
    with session_settings(spark, {TIMESTAMP_TYPE: "TIMESTAMP_MICROS"}):
        query = (spark.readStream.schema("at timestamp").parquet(source).writeStream
                 .format("sparkeos-parquet").option("path", out)
                 .option("checkpointLocation", str(tmp_path / "ckpt"))
                 .trigger(availableNow=True).start())
        with pytest.raises(Exception, match=r"sets spark\.sql\.parquet\.outputTimestampType="
                           r"TIMESTAMP_MICROS, but output directory .* was given INT96"):
            query.awaitTermination()
    assert committed_files(out) == []
