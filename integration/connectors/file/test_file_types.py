"""Drop-in means the same bytes: every Spark SQL type through the file sink's formats and
routes, against Spark's own writer of that kind on the same batch.

JSON: the lines of ``format("sparkeos-json")`` and of
``foreachBatch(exactly_once(FileSink(format="jsonl")))`` (both encoded in the tasks by
``core/text/sparkjson.py``) are the lines ``df.write.json`` writes, byte for byte. Parquet:
what Spark reads back from ``format("sparkeos-parquet")`` is what it reads back from its
own Parquet files.
The session's time zone is not UTC, so zoned timestamps carry an offset."""

from __future__ import annotations

import datetime as dt
import decimal
import glob
from collections.abc import Iterator
from typing import Any

import pytest

from sparkeos import exactly_once
from sparkeos.connectors.file import FileSink, committed_files

SCHEMA = (
    "b boolean, i8 tinyint, i16 smallint, i32 int, i64 bigint, f32 float, f64 double, "
    "d38 decimal(38,18), d10 decimal(10,2), s string, bin binary, day date, ts timestamp, "
    "ntz timestamp_ntz, ints array<int>, counts map<string,int>, byid map<int,string>, "
    "pair struct<a:int,b:string>, "
    "nested array<struct<x:int,tags:array<string>,at:timestamp>>")

READ_SCHEMA = SCHEMA.replace("map<int,string>", "map<string,string>")
"""Spark's JSON reader takes only text map keys."""
BIG = decimal.Decimal("12345678901234567890.123456789012345678")
ROWS: list[tuple[Any, ...]] = [
    (True, 1, 2, 3, 4, 1.5, 0.1, BIG, decimal.Decimal("-99999999.99"), "plain",
     b"\x00\xffbytes", dt.date(1970, 1, 1), dt.datetime(2026, 1, 2, 3, 4, 5, 123456),
     dt.datetime(2026, 7, 2, 3, 4, 5, 999999), [1, None, 3], {"a": 1, "b": None},
     {1: "one"}, (1, "x"), [(1, ["t", None], dt.datetime(2026, 7, 1, 0, 0))]),
    (False, -128, -32768, -2147483648, -9223372036854775808, float("nan"), float("inf"),
     decimal.Decimal("0E-18"), decimal.Decimal("0.00"), 'quote " back \\ tab \t nl \n '
     "bell \x07 é 字 😀", b"", dt.date(1, 1, 1), dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
     dt.datetime(1900, 1, 1), [], {}, {}, (None, None), [None, (None, [], None)]),
    (None, 127, 32767, 2147483647, 9223372036854775807, -0.0, float("-inf"),
     decimal.Decimal("0.000000012345678901"), decimal.Decimal("12.30"), "",
     None, dt.date(9999, 12, 31), dt.datetime(2026, 3, 29, 1, 30), None, None, None, None,
     None, None),
    (None, None, None, None, None, 3.4028235e38, 1e20, None, None, None, None, None, None,
     None, [None], {"k": None}, None, (7, None), []),
    (None, None, None, None, None, 1e-7, 5e-7, None, None, None, None, None, None, None,
     None, None, None, None, None),
    (None, None, None, None, None, 16777216.0, 123456789.0, None, None, None, None, None,
     None, None, None, None, None, None, None),
    (None, None, None, None, None, None, 0.001, None, None, None, None, None, None, None,
     None, None, None, None, None),
    (None, None, None, None, None, None, 1234567.125, None, None, None, None, None, None,
     None, None, None, None, None, None),
    (None,) * 19,
]
ZONE = "America/Los_Angeles"


@pytest.fixture
def zoned(spark: Any) -> Iterator[Any]:
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", ZONE)
    try:
        yield spark
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


def _lines(files: list[str]) -> list[str]:
    found: list[str] = []
    for file in files:
        with open(file, encoding="utf-8") as handle:
            found += handle.read().splitlines()
    return sorted(found)


def test_every_type_is_written_as_sparks_own_writers_write_it(zoned: Any, tmp_path: Any) -> None:
    spark = zoned
    source = str(tmp_path / "in")
    spark.createDataFrame(ROWS, SCHEMA).coalesce(1).write.parquet(source)
    batch = spark.read.parquet(source)
    batch.write.json(str(tmp_path / "spark-json"))
    batch.write.parquet(str(tmp_path / "spark-parquet"))

    def run(writer: Any, name: str) -> None:
        query = (writer.option("checkpointLocation", str(tmp_path / f"ckpt-{name}"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()

    stream = spark.readStream.schema(SCHEMA).parquet(source)
    run(stream.writeStream.format("sparkeos-json").option("path", str(tmp_path / "f-json")),
        "format-json")
    run(stream.writeStream.foreachBatch(exactly_once(
        FileSink(str(tmp_path / "fb-json"), format="jsonl"), name="types")), "fb-json")
    run(stream.writeStream.format("sparkeos-parquet")
        .option("path", str(tmp_path / "f-parquet")), "format-parquet")

    spark_json = _lines(sorted(glob.glob(str(tmp_path / "spark-json" / "part-*.json"))))
    assert len(spark_json) == len(ROWS)
    format_json = _lines(committed_files(str(tmp_path / "f-json"), "jsonl"))
    foreach_json = _lines(committed_files(str(tmp_path / "fb-json"), "jsonl"))
    assert format_json == spark_json, _difference(format_json, spark_json)
    assert foreach_json == spark_json, _difference(foreach_json, spark_json)
    # Spark reads every value back from the JSON as from its own file.
    back = spark.read.schema(READ_SCHEMA).json(str(tmp_path / "f-json"))
    own = spark.read.schema(READ_SCHEMA).json(str(tmp_path / "spark-json"))
    assert sorted(back.toJSON().collect()) == sorted(own.toJSON().collect())

    ours = spark.read.parquet(str(tmp_path / "f-parquet"))
    theirs = spark.read.parquet(str(tmp_path / "spark-parquet"))
    assert ours.schema == theirs.schema
    assert sorted(ours.toJSON().collect()) == sorted(theirs.toJSON().collect())
    assert sorted(ours.toJSON().collect()) == spark_json  # and nothing was lost on the way


def _difference(ours: list[str], theirs: list[str]) -> str:
    only_ours = [line for line in ours if line not in theirs]
    only_theirs = [line for line in theirs if line not in ours]
    return "sparkeos wrote:\n  " + "\n  ".join(only_ours) + "\nSpark wrote:\n  " + \
        "\n  ".join(only_theirs)


PARTITIONED_SCHEMA = "id long, day date, country string, flag boolean, amount decimal(10,2)"
PARTITIONED_ROWS: list[tuple[Any, ...]] = [
    (1, dt.date(2026, 11, 26), "DE", True, decimal.Decimal("1.50")),
    (2, dt.date(2026, 11, 26), "a/b=c:d%e", False, decimal.Decimal("-0.01")),
    (3, dt.date(2026, 11, 27), None, None, None),
    (4, None, "", True, decimal.Decimal("99999999.99")),
    (5, dt.date(2026, 11, 26), "DE", True, decimal.Decimal("1.50")),
    (6, dt.date(2026, 11, 27), "é 字 #?*", False, decimal.Decimal("0.00")),
]
PARTITION_BY = ["day", "country", "flag", "amount"]


def _layout(root: Any) -> list[str]:
    """Each part file's directory, relative to ``root`` (Spark's and ours alike)."""
    import os

    return sorted(os.path.relpath(os.path.dirname(f), root) for f in
                  glob.glob(str(root / "**" / "part-*"), recursive=True))


def test_partitioned_output_is_laid_out_as_sparks_partition_by(spark: Any,
                                                               tmp_path: Any) -> None:
    """``FileSink(partition_by=...)`` and ``.option("sparkeos.partitionBy", ...)`` write
    the directories Spark's own ``partitionBy`` writes for the same batch (escaped
    values, Spark's default partition for nulls and empty strings), and Spark reads the
    same rows back, partition columns included."""
    source = str(tmp_path / "in")
    spark.createDataFrame(PARTITIONED_ROWS, PARTITIONED_SCHEMA).coalesce(1) \
        .write.parquet(source)
    spark.read.parquet(source).write.partitionBy(*PARTITION_BY) \
        .parquet(str(tmp_path / "spark"))
    stream = spark.readStream.schema(PARTITIONED_SCHEMA).parquet(source)
    for name, writer in (
            ("foreachbatch", stream.writeStream.foreachBatch(exactly_once(
                FileSink(str(tmp_path / "foreachbatch"), partition_by=PARTITION_BY),
                name="partitioned"))),
            ("format", stream.writeStream.format("sparkeos-parquet")
             .option("path", str(tmp_path / "format"))
             .option("sparkeos.partitionBy", ",".join(PARTITION_BY))),
            ("format-json", stream.writeStream.format("sparkeos-json")
             .option("path", str(tmp_path / "format-json"))
             .option("sparkeos.partitionBy", ",".join(PARTITION_BY)))):
        query = (writer.option("checkpointLocation", str(tmp_path / f"ckpt-{name}"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()

    theirs = spark.read.parquet(str(tmp_path / "spark"))
    expected = sorted(theirs.toJSON().collect())
    assert len(expected) == len(PARTITIONED_ROWS)
    for name in ("foreachbatch", "format", "format-json"):
        assert set(_layout(tmp_path / name)) == set(_layout(tmp_path / "spark")), name
        read = spark.read.json if name == "format-json" else spark.read.parquet
        ours = read(str(tmp_path / name)).select(*theirs.columns)
        if name == "format-json":  # JSON's own reader types the data columns otherwise
            ours = ours.selectExpr(*(f"CAST({c} AS {theirs.schema[c].dataType.simpleString()})"
                                     f" AS {c}" for c in theirs.columns))
        assert sorted(ours.toJSON().collect()) == expected, name
