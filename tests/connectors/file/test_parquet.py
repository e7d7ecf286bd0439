"""The file sink's Parquet as Spark writes it (``connectors/file/parquet*.py``), without
Spark: the footer's Thrift codec, the settings and their refusals, Spark's text of a
schema, and a part file's footer. The generated differential test against Spark's own
writer is integration/connectors/file/test_generated_parquet.py."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import types as T

from sparkeos.connectors.file import FileSink, committed_files, read_output
from sparkeos.connectors.file import parquet_footer as footer
from sparkeos.connectors.file.parquet import (
    ROW_METADATA_KEY,
    VERSION_KEY,
    ParquetSettings,
    SparkParquetWriter,
)
from sparkeos.connectors.file.parquet_schema import java_double, schema_text
from sparkeos.connectors.file.parquet_settings import (
    CODEC,
    DATETIME_REBASE,
    LEGACY_FORMAT,
    TIMESTAMP_TYPE,
)
from sparkeos.core.errors import ConfigurationError, DataRejectedError
from sparkeos.core.snapshot.txpool import TransactionPool
from sparkeos.core.streaming.spark import SPARK_SCHEMA_KEY
from sparkeos.testing.inprocess import ID_SCHEMA, id_batch

POOL = TransactionPool("q0", "files")


def _write(sink: FileSink, batch: pa.RecordBatch) -> str:
    txn = POOL.transaction(0, 0, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, batch)
    sink.commit(txn, sink.prepare(handle))
    [written] = committed_files(sink.path)
    return written


def test_a_footer_decodes_and_encodes_to_the_same_bytes(tmp_path):
    """Every field pyarrow writes (statistics, orders, lists longer than 14, negative
    numbers, booleans) survives a decode and encode unchanged."""
    path = str(tmp_path / "f.parquet")
    table = pa.table({f"c{i}": pa.array([-i, None, 2 ** 40], pa.int64()) for i in range(20)})
    pq.write_table(table, path)
    metadata, start = footer.read_footer(path)
    with open(path, "rb") as handle:
        data = handle.read()
    assert footer.encode(metadata) == data[start:-8]
    nested: footer.Struct = [
        footer.Field(1, footer.BOOL, False), footer.Field(2, footer.I32, -7),
        footer.Field(40, footer.LIST, footer.ThriftList(footer.BOOL, [True, False] * 9)),
        footer.Field(41, 7, -0.5), footer.Field(42, 11, (8, 5, [(b"k", -1)])),
        footer.Field(43, footer.BYTE, -3)]
    assert footer.decode(footer.encode(nested)) == nested


@pytest.mark.parametrize(("value", "text"), [
    (1e20, "1.0E20"), (2.5, "2.5"), (100.0, "100.0"), (0.001, "0.001"), (1e-4, "1.0E-4"),
    (1234567.0, "1234567.0"), (1e7, "1.0E7"), (-1.5e-5, "-1.5E-5"), (-0.0, "-0.0"),
    (123456789.125, "1.23456789125E8")])
def test_numbers_in_field_metadata_are_written_as_java_writes_a_double(value, text):
    assert java_double(value) == text


def test_a_schema_is_written_as_sparks_json_with_its_key_order_and_escapes():
    schema = T.StructType([
        T.StructField("é \u0001\t\"", T.ArrayType(T.DecimalType(10, 2), False), False,
                      {"comment": "x", "w": 1e20}),
        T.StructField("m", T.MapType(T.StringType(), T.TimestampNTZType()), True)])
    assert schema_text(schema) == (
        '{"type":"struct","fields":[{"name":"é \\u0001\\t\\"","type":{"type":"array",'
        '"elementType":"decimal(10,2)","containsNull":false},"nullable":false,'
        '"metadata":{"comment":"x","w":1.0E20}},{"name":"m","type":{"type":"map",'
        '"keyType":"string","valueType":"timestamp_ntz","valueContainsNull":true},'
        '"nullable":true,"metadata":{}}]}')


def test_settings_are_read_as_spark_reads_them_and_refused_where_spark_would_differ():
    where = "output directory /out"
    settings = ParquetSettings.resolve({TIMESTAMP_TYPE: "timestamp_millis",
                                        LEGACY_FORMAT: "TRUE", CODEC: "UNCOMPRESSED"},
                                       None, where)
    assert (settings.timestamps, settings.legacy, settings.codec, settings.extension) == \
        ("TIMESTAMP_MILLIS", True, "none", "")
    # Spark's compression write option wins over the session's codec.
    assert ParquetSettings.resolve({CODEC: "gzip"}, "zstd", where).codec == "zstd"
    for bad, match in (({TIMESTAMP_TYPE: "INT64"}, "not one of Spark's"),
                       ({LEGACY_FORMAT: "yes"}, "not true or false"),
                       ({CODEC: "lz4"}, "Hadoop's LZ4 framing"),
                       ({CODEC: "lzo"}, "does not write LZO"),
                       ({CODEC: "bzip2"}, "unknown Parquet compression"),
                       ({DATETIME_REBASE: "LEGACY"}, "Julian calendar")):
        with pytest.raises(ConfigurationError, match=match) as error:
            ParquetSettings.resolve(bad, None, where)
        assert error.value.fix and where in str(error.value)


def test_a_task_refuses_a_session_that_sets_what_the_sink_was_not_told():
    """Spark's own writer follows the query's session (its tasks see every setting it
    sets); a format that was not told (no register, no option) refuses before writing."""
    settings = ParquetSettings.resolve({}, None, "output directory /out")
    session = {TIMESTAMP_TYPE: "TIMESTAMP_MICROS"}
    with pytest.raises(ConfigurationError, match=r"sets spark\.sql\.parquet\.outputTimestamp"
                       r"Type=TIMESTAMP_MICROS, but output directory /out was given INT96"
                       ) as error:
        settings.check_session(session.get, "output directory /out")
    assert error.value.fix and "sparkeos.register(spark)" in error.value.fix
    settings.check_session({TIMESTAMP_TYPE: "int96", CODEC: "snappy"}.get, "here")
    # The compression option wins over the session's codec, as in Spark.
    ParquetSettings.resolve({}, "zstd", "here").check_session({CODEC: "gzip"}.get, "here")
    with pytest.raises(ConfigurationError, match="Julian"):
        settings.check_session({DATETIME_REBASE: "LEGACY"}.get, "here")


def test_a_sink_without_spark_writes_sparks_schema_of_its_arrow_types(tmp_path):
    """No Spark schema from a driver (a sink used directly): the Spark types of the
    Arrow ones, Spark's defaults (INT96, snappy) and Spark's keys."""
    sink = FileSink(str(tmp_path))
    sink.validate(ID_SCHEMA)
    written = _write(sink, id_batch([1, 2]))
    assert written.endswith(".snappy.parquet")
    meta = pq.ParquetFile(written).metadata
    assert json.loads(meta.metadata[ROW_METADATA_KEY.encode()]) == \
        T.StructType([T.StructField("id", T.LongType()),
                      T.StructField("payload", T.StringType())]).jsonValue()
    assert set(meta.metadata) == {ROW_METADATA_KEY.encode(), VERSION_KEY.encode()}
    assert meta.schema.to_arrow_schema().names == ["id", "payload"]
    assert pq.read_table(written).column("id").to_pylist() == [1, 2]


def test_the_drivers_spark_schema_and_settings_shape_the_file(tmp_path):
    """The Spark schema validate is given (both routes put it in the Arrow schema) is
    written, exactly: required fields, field IDs, timestamp_ntz beside INT96 (which
    pyarrow alone writes as INT96 too), legacy lists."""
    spark = T.StructType([
        T.StructField("id", T.LongType(), False, {"parquet.field.id": 7}),
        T.StructField("at", T.TimestampType()), T.StructField("local", T.TimestampNTZType()),
        T.StructField("tags", T.ArrayType(T.ShortType(), False))])
    arrow = pa.schema([pa.field("id", pa.int64(), False),
                       ("at", pa.timestamp("us", tz="UTC")), ("local", pa.timestamp("us")),
                       ("tags", pa.list_(pa.field("element", pa.int16(), False)))],
                      metadata={SPARK_SCHEMA_KEY: spark.json()})
    sink = FileSink(str(tmp_path), spark_settings={LEGACY_FORMAT: "true"})
    sink.validate(arrow)
    batch = pa.RecordBatch.from_pylist(
        [{"id": 1, "at": -1, "local": 1_500, "tags": [1, 2]}], schema=arrow)
    path = _write(sink, batch)
    written = pq.ParquetFile(path)
    text = str(written.schema)
    assert "required int64 field_id=7 id;" in text
    assert "optional int96 field_id=-1 at;" in text
    assert "optional int64 field_id=-1 local (Timestamp(isAdjustedToUTC=false" in text
    assert "repeated int32 field_id=-1 array (Int(bitWidth=16" in text
    assert "spark_schema" in text
    assert json.loads(written.metadata.metadata[ROW_METADATA_KEY.encode()]) == \
        spark.jsonValue()
    assert pq.read_table(path).column("local").cast(pa.int64()).to_pylist() == [1_500]


def test_millisecond_timestamps_are_floored_as_spark_floors_them(tmp_path):
    """Spark takes microseconds to milliseconds with floorDiv, in nested values too;
    Arrow's cast truncates toward zero (one millisecond later before 1970)."""
    spark = T.StructType([T.StructField("at", T.TimestampType()),
                          T.StructField("deep", T.MapType(T.StringType(), T.ArrayType(
                              T.StructType([T.StructField("t", T.TimestampType())]))))])
    zoned = pa.timestamp("us", tz="America/Los_Angeles")
    deep = pa.map_(pa.string(), pa.list_(pa.struct([("t", zoned)])))
    path = str(tmp_path / "f.parquet")
    writer = SparkParquetWriter(path, spark, ParquetSettings(timestamps="TIMESTAMP_MILLIS"))
    writer.write_batch(pa.RecordBatch.from_pylist(
        [{"at": -1001, "deep": [("k", [{"t": -1}, None, {"t": 1999}])]},
         {"at": None, "deep": None}],
        schema=pa.schema([("at", zoned), ("deep", deep)])))
    writer.close()
    rows = pq.read_table(path).to_pylist()
    millis = pq.read_table(path).column("at").cast(pa.int64()).to_pylist()
    assert millis == [-2, None]
    [(_, items)] = rows[0]["deep"]
    assert [None if i is None else i["t"].timestamp() for i in items] == [-0.001, None, 0.001]
    assert rows[1]["deep"] is None


def test_types_spark_does_not_write_as_parquet_columns_are_refused_at_validate(tmp_path):
    spark = T.StructType([T.StructField("v", T.VariantType())])
    arrow = pa.schema([("v", pa.struct([("value", pa.binary()), ("metadata", pa.binary())]))],
                      metadata={SPARK_SCHEMA_KEY: spark.json()})
    with pytest.raises(ConfigurationError, match="column 'v' is of type variant") as error:
        FileSink(str(tmp_path)).validate(arrow)
    assert error.value.fix and "to_json(v)" in error.value.fix


def test_unknown_spark_settings_of_a_sink_are_refused(tmp_path):
    with pytest.raises(ConfigurationError, match=r"spark\.sql\.parquet\.mergeSchema"):
        FileSink(str(tmp_path), spark_settings={"spark.sql.parquet.mergeSchema": "true"})


@pytest.mark.parametrize("timestamps", ["INT96", "TIMESTAMP_MICROS", "TIMESTAMP_MILLIS"])
def test_required_fields_under_null_parents_are_written_from_slices(tmp_path, timestamps):
    """Spark hands over a null struct's required fields as nulls (Arrow's cast refuses
    those), in slices of lists and maps; each is written, in every timestamp layout."""
    inner = T.StructType([T.StructField("d", T.DateType(), False),
                          T.StructField("n", T.TimestampNTZType(), False),
                          T.StructField("t", T.TimestampType(), False)])
    spark = T.StructType([T.StructField("o", T.StructType([
                              T.StructField("i", inner, False),
                              T.StructField("xs", T.ArrayType(T.IntegerType()), False),
                              T.StructField("kv", T.MapType(T.StringType(), T.IntegerType()),
                                            False)])),
                          T.StructField("l", T.ArrayType(inner, False)),
                          T.StructField("m", T.MapType(T.StringType(), inner, False))])
    zoned = pa.struct([pa.field("d", pa.date32(), False), pa.field("n", pa.timestamp("us"),
                                                                   False),
                       pa.field("t", pa.timestamp("us", tz="Europe/Paris"), False)])
    value = {"d": 1, "n": 5, "t": -1}
    structs = pa.StructArray.from_arrays(
        [pa.array([1, None, 3], pa.date32()), pa.array([5, None, 6], pa.timestamp("us")),
         pa.array([-1, None, 1999], pa.timestamp("us", tz="Europe/Paris"))],
        fields=list(zoned), mask=pa.array([False, True, False]))
    lists, maps = pa.list_(pa.int32()), pa.map_(pa.string(), pa.int32())
    outer_fields = [pa.field("i", zoned, False), pa.field("xs", lists, False),
                    pa.field("kv", maps, False)]
    outer = pa.StructArray.from_arrays(
        [structs, pa.array([[1], None, [2, 3]], lists), pa.array([[("a", 1)], None, []], maps)],
        fields=outer_fields, mask=pa.array([False, True, False]))
    batch = pa.RecordBatch.from_arrays([
        outer, pa.array([[value], None, []], pa.list_(pa.field("element", zoned, False))),
        pa.array([[("k", value)], None, []], pa.map_(pa.string(), pa.field("value", zoned,
                                                                           False)))],
        names=["o", "l", "m"])
    path = str(tmp_path / "f.parquet")
    writer = SparkParquetWriter(path, spark, ParquetSettings(timestamps=timestamps))
    writer.write_batch(batch.slice(1))
    writer.close()
    rows = pq.read_table(path).to_pylist()
    assert [(r["o"] is None, r["l"], r["m"]) for r in rows] == [(True, None, None),
                                                               (False, [], [])]
    assert rows[1]["o"]["i"]["n"] == dt.datetime(1970, 1, 1, 0, 0, 0, 6)
    assert (rows[1]["o"]["xs"], rows[1]["o"]["kv"]) == ([2, 3], [])
    with pytest.raises(DataRejectedError, match=r"field o\.i\.d is not nullable"):
        broken = pa.StructArray.from_arrays(
            [pa.StructArray.from_arrays([structs.field(i) for i in range(3)],
                                        fields=list(zoned)),  # its nulls now shown
             outer.field(1), outer.field(2)], fields=outer_fields)
        SparkParquetWriter(str(tmp_path / "g.parquet"), spark, ParquetSettings()).write_batch(
            pa.RecordBatch.from_arrays([broken, batch.column(1), batch.column(2)],
                                       names=["o", "l", "m"]))


def test_partitioned_files_hold_sparks_schema_of_their_data_columns(tmp_path):
    """As Spark's partitionBy: the partition columns are in the directory names, not in
    the files' schema or their row metadata."""
    spark = T.StructType([T.StructField("id", T.LongType(), False),
                          T.StructField("day", T.StringType())])
    arrow = pa.schema([pa.field("id", pa.int64(), False), ("day", pa.string())],
                      metadata={SPARK_SCHEMA_KEY: spark.json()})
    sink = FileSink(str(tmp_path), partition_by=["day"])
    sink.validate(arrow)
    written = _write(sink, pa.RecordBatch.from_pylist([{"id": 1, "day": "d"}], schema=arrow))
    assert "/day=d/" in written
    meta = pq.ParquetFile(written).metadata
    assert json.loads(meta.metadata[ROW_METADATA_KEY.encode()]) == \
        T.StructType([spark.fields[0]]).jsonValue()


def test_read_output_reads_int96_timestamps_of_every_year_as_spark_does(tmp_path):
    """pyarrow reads INT96 in nanoseconds by default (years 1677 to 2262 only);
    read_output gives Spark's types: microseconds in UTC, tinyint as int8."""
    spark = T.StructType([T.StructField("at", T.TimestampType()),
                          T.StructField("b", T.ByteType())])
    arrow = pa.schema([("at", pa.timestamp("us", tz="UTC")), ("b", pa.int8())],
                      metadata={SPARK_SCHEMA_KEY: spark.json()})
    far = [-62135596800000000, 253402300799999999 * 3, None]
    sink = FileSink(str(tmp_path))
    sink.validate(arrow)
    _write(sink, pa.RecordBatch.from_pydict({"at": far, "b": [1, -1, None]}, schema=arrow))
    table = read_output(str(tmp_path))
    assert table.schema == pa.schema([("at", pa.timestamp("us", tz="UTC")), ("b", pa.int8())])
    assert table.column("at").cast(pa.int64()).to_pylist() == far
