"""Parquet part files as Spark's own Parquet writer writes them: the physical schema,
the key-value metadata and the codec it gives the same data under the same settings.

Spark's writer follows session settings (``spark.sql.parquet.outputTimestampType``,
``writeLegacyFormat``, ``compression.codec``, ``fieldId.write.enabled``); so does the
file sink (``ParquetSettings``). pyarrow writes the pages, with the physical types
Spark's writer chooses (INT96 or INT64 timestamps, decimals as INT32/INT64 or
fixed-length bytes); the footer then gets Spark's schema for them
(``parquet_schema``: the names, annotations and field IDs Spark's writer gives,
among them its legacy lists and ``timestamp_ntz`` as INT64 beside INT96 timestamps,
which pyarrow cannot mix) and Spark's key-value metadata: the Spark schema
(``org.apache.spark.sql.parquet.row.metadata``, which Spark reads to restore exact
types) and ``org.apache.spark.version``. What still differs is in docs/formats.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkeos.core.errors import ConfigurationError, DataRejectedError, SchemaMismatchError

from . import parquet_footer as footer
from .parquet_schema import (
    INT96_TIMESTAMPS,
    MICROS_TIMESTAMPS,
    MILLIS_TIMESTAMPS,
    file_leaves,
    parquet_schema,
    schema_text,
)
from .parquet_settings import (
    CODEC,
    FIELD_IDS,
    FOLLOWED,
    LEGACY_FORMAT,
    SETTINGS,
    TIMESTAMP_TYPE,
)

ROW_METADATA_KEY = "org.apache.spark.sql.parquet.row.metadata"
VERSION_KEY = "org.apache.spark.version"

CODEC_EXTENSIONS = {"none": "", "snappy": ".snappy", "gzip": ".gz", "brotli": ".br",
                    "zstd": ".zstd", "lz4_raw": ".lz4raw"}
"""Parquet's own codec extensions (``CompressionCodecName``), which Spark puts in a
file's name, by Spark's codec names."""
_ARROW_CODECS = {"none": "none", "snappy": "snappy", "gzip": "gzip", "brotli": "brotli",
                 "zstd": "zstd", "lz4_raw": "lz4"}
_LEVELS = {"gzip": 6, "zstd": 3}
"""parquet-mr's default levels (zlib's default, ``parquet.compression.codec.zstd.level``)."""
_NOT_WRITABLE = {
    "lz4": "Spark's lz4 is Hadoop's LZ4 framing, which pyarrow does not write",
    "lzo": "pyarrow does not write LZO"}
_REBASE_MODES = ("CORRECTED", "EXCEPTION")


@dataclass(frozen=True)
class ParquetSettings:
    """The settings of Spark's Parquet writer that a part file follows."""

    timestamps: str = INT96_TIMESTAMPS
    legacy: bool = False
    codec: str = "snappy"
    field_ids: bool = True
    codec_given: bool = False
    """The codec was given as Spark's ``compression`` write option (or ``FileSink``'s
    ``compression``): it wins over the session's codec, as in Spark."""

    @classmethod
    def resolve(cls, settings: Mapping[str, str], compression: str | None,
                where: str) -> ParquetSettings:
        """The settings from Spark's settings by name (what is not there: Spark's
        default) and the ``compression`` option, which wins over the codec setting."""
        values = {name: parse(name, value, f"{where} ({name})")
                  for name, value in settings.items() if name in SETTINGS}
        codec = values.get(CODEC, "snappy")
        if compression is not None:
            codec = parse(CODEC, compression, f"{where} (compression)")
        return cls(timestamps=str(values.get(TIMESTAMP_TYPE, INT96_TIMESTAMPS)),
                   legacy=bool(values.get(LEGACY_FORMAT, False)), codec=str(codec),
                   field_ids=bool(values.get(FIELD_IDS, True)),
                   codec_given=compression is not None)

    @property
    def extension(self) -> str:
        """What Spark's writer puts before ``.parquet`` in a part file's name."""
        return CODEC_EXTENSIONS[self.codec]

    def value(self, name: str) -> str | bool:
        """The value of the setting ``name`` of ``FOLLOWED``."""
        values: dict[str, str | bool] = {TIMESTAMP_TYPE: self.timestamps,
                                         LEGACY_FORMAT: self.legacy, CODEC: self.codec,
                                         FIELD_IDS: self.field_ids}
        return values[name]

    def check_session(self, session: Callable[[str], str | None], where: str) -> None:
        """Refuse to write where the query's session (``session``: its setting by name, as
        a Spark task sees it) sets one of the settings otherwise than these: Spark's own
        writer would follow the session."""
        for name in SETTINGS:
            text = session(name)
            if text is None or (name == CODEC and self.codec_given):
                continue
            value = parse(name, text, f"the query's session ({name})")
            mine = self.value(name) if name in FOLLOWED else value
            if value != mine:
                shown = str(mine).lower() if isinstance(mine, bool) else mine
                raise ConfigurationError(
                    f"the query's session sets {name}={text}, but {where} was given "
                    f"{shown}: Spark's own Parquet writer would follow the session (a "
                    "Python data source gets no session settings; the format has them "
                    "from sparkeos.register(spark) or from options of the same names)",
                    fix=f"call sparkeos.register(spark) after setting {name}, or "
                    f'.option("{name}", "{text}") (FileSink(spark_settings={{"{name}": '
                    f'"{text}"}}) on foreachBatch); nothing of this batch was committed')


def parse(name: str, text: str, where: str) -> str | bool:
    """Spark's setting ``name`` set to ``text``, as Spark reads it; refused where Spark
    refuses it or where sparkeos cannot write what Spark would."""
    value = str(text).strip()
    if name in (LEGACY_FORMAT, FIELD_IDS):
        if value.lower() not in ("true", "false"):
            raise ConfigurationError(f"{name}={text!r} of {where} is not true or false",
                                     fix=f'set {name} to "true" or "false"')
        return value.lower() == "true"
    if name == TIMESTAMP_TYPE:
        kinds = (INT96_TIMESTAMPS, MICROS_TIMESTAMPS, MILLIS_TIMESTAMPS)
        if value.upper() not in kinds:
            raise ConfigurationError(f"{name}={text!r} of {where} is not one of Spark's "
                                     f"{', '.join(kinds)}",
                                     fix=f"set {name} to one of {', '.join(kinds)}")
        return value.upper()
    if name == CODEC:
        codec = {"uncompressed": "none"}.get(value.lower(), value.lower())
        if codec in _NOT_WRITABLE:
            raise ConfigurationError(
                f"{where} asks for the Parquet codec {text!r}: {_NOT_WRITABLE[codec]}",
                fix="use another codec (lz4_raw for LZ4, Spark's name since 3.5), or "
                "Spark's own parquet sink")
        if codec not in CODEC_EXTENSIONS:
            raise ConfigurationError(f"unknown Parquet compression {text!r} of {where}",
                                     fix=f"use one of: {', '.join(CODEC_EXTENSIONS)}")
        return codec
    mode = value.upper()
    if mode == "LEGACY":
        raise ConfigurationError(
            f"{name}=LEGACY of {where}: Spark would rebase dates and timestamps before "
            "1582 to the Julian calendar, which sparkeos does not do",
            fix=f"unset {name} (Spark's default, CORRECTED, writes the proleptic "
            "Gregorian calendar), or write with Spark's own parquet sink")
    if mode not in _REBASE_MODES:
        raise ConfigurationError(f"{name}={text!r} of {where} is not one of Spark's "
                                 "EXCEPTION, CORRECTED, LEGACY",
                                 fix=f"unset {name}")
    return mode


def active_session_settings() -> dict[str, str]:
    """The settings of ``SETTINGS`` that this process's active Spark session sets (none
    where there is no session: a Spark worker, the format's planner)."""
    try:
        from pyspark.sql import SparkSession

        from sparkeos.core.streaming.spark import session_settings

        session = SparkSession.getActiveSession()
        return session_settings(session, SETTINGS) if session is not None else {}
    except Exception:  # no pyspark, or a session that cannot answer
        return {}


def spark_version() -> str:
    """The Spark version written in ``org.apache.spark.version``: that of this pyspark,
    as Spark writes its own (``major.minor.patch``). Spark reads files of versions
    before 3.0 as written in the hybrid calendar, so it must be a true one."""
    import pyspark

    found = re.match(r"\d+\.\d+\.\d+", pyspark.__version__)
    return found.group(0) if found else pyspark.__version__


def spark_schema_of(arrow: pa.Schema, spark_json: str | None) -> Any:
    """The Spark schema of a file holding ``arrow``'s columns: the batch's Spark schema
    (``spark_json``, from the driver; only these columns), or where there is none (a
    sink used without Spark) the Spark types of the Arrow ones."""
    from pyspark.sql.types import StructType

    if spark_json is None:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(arrow)
    schema = StructType.fromJson(json.loads(spark_json))
    names = set(arrow.names)
    return StructType([f for f in schema.fields if f.name in names])


def read_table(source: Any) -> pa.Table:
    """A part file as Arrow, with the types Spark reads it as where it holds Spark's
    schema: INT96 timestamps in microseconds and UTC (pyarrow's default nanoseconds hold
    the years 1677 to 2262 only), ``tinyint`` and day-time intervals as such."""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    table = pq.read_table(source, coerce_int96_timestamp_unit="us")
    text = (table.schema.metadata or {}).get(ROW_METADATA_KEY.encode())
    if text is None:  # not written as Spark writes (an earlier sparkeos)
        return table
    spark = to_arrow_schema(StructType.fromJson(json.loads(text)), timezone="UTC")
    fields = [field for field in spark if field.name in table.column_names]
    return pa.table([_written(table.column(f.name).combine_chunks(), f.type, False, None,
                              f.name) for f in fields], schema=pa.schema(fields))


@dataclass(frozen=True)
class ParquetFiles:
    """How a sink's Parquet part files are written: the settings, and the batch's Spark
    schema (its JSON, from the driver; None for a sink used without Spark)."""

    settings: ParquetSettings
    spark_schema: str | None

    def writer(self, target: str, arrow: pa.Schema) -> SparkParquetWriter:
        """A writer of the part file ``target`` of rows of ``arrow``'s columns."""
        return SparkParquetWriter(target, spark_schema_of(arrow, self.spark_schema),
                                  self.settings)


class SparkParquetWriter:
    """One part file, written as Spark's writer writes its rows (``write_batch``, then
    ``close``; ``ParquetWriter``'s calls)."""

    def __init__(self, target: str, spark_schema: Any, settings: ParquetSettings) -> None:
        import pyarrow.parquet as pq
        from pyspark.sql.pandas.types import to_arrow_schema

        self.target, self.settings = target, settings
        self._spark = parquet_schema(spark_schema, settings.timestamps, settings.legacy,
                                     settings.field_ids)
        self._metadata = [(VERSION_KEY, spark_version()),
                          (ROW_METADATA_KEY, schema_text(spark_schema))]
        self.schema = pa.schema([pa.field(f.name, _written_type(f.type, settings),
                                          f.nullable)
                                 for f in to_arrow_schema(spark_schema, timezone="UTC")])
        self._writer = pq.ParquetWriter(
            target, self.schema, compression=_ARROW_CODECS[settings.codec],
            compression_level=_LEVELS.get(settings.codec), version="1.0",
            use_deprecated_int96_timestamps=settings.timestamps == INT96_TIMESTAMPS,
            store_decimal_as_integer=not settings.legacy, store_schema=False,
            write_page_index=True, write_page_checksum=True)  # parquet-mr writes both
        self._closed = False

    def write_batch(self, batch: pa.RecordBatch) -> None:
        columns = [_written(batch.column(field.name), field.type, not field.nullable,
                            None, field.name) for field in self.schema]
        self._writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=self.schema))

    def close(self) -> None:
        """Finish the file: pyarrow's footer, then Spark's schema and metadata in it."""
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        metadata, start = footer.read_footer(self.target)
        written = footer.get(metadata, 2).items
        if [_levels(leaf) for leaf in file_leaves(written)] != \
                [_levels(leaf) for leaf in self._spark.leaves]:
            raise SchemaMismatchError(
                f"the columns written to {self.target} do not line up with Spark's Parquet "
                f"schema for them ({file_leaves(written)} against {self._spark.leaves})",
                fix="report this with the query's schema; write with Spark's own parquet "
                "sink meanwhile; the part file was not committed")
        footer.put(metadata, 2, footer.LIST, footer.ThriftList(footer.STRUCT,
                                                               self._spark.elements))
        for group in footer.get(metadata, 4).items if footer.get(metadata, 4) else ():
            for chunk, leaf in zip(footer.get(group, 1).items, self._spark.leaves,
                                   strict=True):
                footer.put(footer.get(chunk, 3), 3, footer.LIST, footer.ThriftList(
                    footer.BINARY, [name.encode() for name in leaf.path]))
        footer.put(metadata, 5, footer.LIST, footer.ThriftList(footer.STRUCT, [
            [footer.Field(1, footer.BINARY, key.encode()),
             footer.Field(2, footer.BINARY, value.encode())]
            for key, value in self._metadata]))
        footer.replace_footer(self.target, metadata, start)


def _levels(leaf: Any) -> tuple[int, int, int, int]:
    return (leaf.physical, leaf.length, leaf.max_definition, leaf.max_repetition)


def _written_type(kind: pa.DataType, settings: ParquetSettings) -> pa.DataType:
    """The Arrow type pyarrow writes a Spark column's values as (Arrow's type of the
    Spark type, with timestamps in the unit Spark writes them in)."""
    if pa.types.is_timestamp(kind):
        if kind.tz is None:  # timestamp_ntz: INT64 micros, also beside INT96 timestamps
            return pa.int64() if settings.timestamps == INT96_TIMESTAMPS else kind
        unit = "ms" if settings.timestamps == MILLIS_TIMESTAMPS else "us"
        return pa.timestamp(unit, tz="UTC")
    if pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_large_binary(kind):
        return pa.binary()
    if pa.types.is_map(kind):
        return pa.map_(_written_field(kind.key_field, settings),
                       _written_field(kind.item_field, settings))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return pa.list_(_written_field(kind.value_field, settings))
    if pa.types.is_struct(kind):
        return pa.struct([_written_field(kind.field(i), settings)
                          for i in range(kind.num_fields)])
    return kind


def _written_field(field: pa.Field, settings: ParquetSettings) -> pa.Field:
    return pa.field(field.name, _written_type(field.type, settings), field.nullable)


def _entries(array: Any, values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """A list or map array's offsets from 0 (int32) and the part of ``values`` (its
    elements, keys or items) they index: a slice of one cannot be rebuilt with nulls."""
    offsets = array.offsets
    first, last = offsets[0].as_py(), offsets[len(offsets) - 1].as_py()
    return pc.subtract(offsets, first).cast(pa.int32()), values.slice(first, last - first)


def _written(array: pa.Array, kind: pa.DataType, required: bool = False,
             hidden: pa.Array | None = None, where: str = "") -> pa.Array:
    """``array`` (as Spark hands it over) as the type ``kind`` of the written schema:
    the same shape, with Spark's nullability of fields, zoned timestamps floored to
    milliseconds where Spark writes those (``Math.floorDiv``; Arrow's cast truncates
    toward zero, a millisecond later before 1970), and ``timestamp_ntz`` as its INT64
    microseconds beside INT96.

    A ``required`` field (Spark's non-nullable) holds nulls where Spark hands over a
    null struct around it (``hidden``: the rows a null parent hides); no page holds
    those, and pyarrow refuses a required column with nulls, so they are made valid. A
    null anywhere else in a required field is refused, as Spark's writer fails on it."""
    nulls = array.is_null() if array.null_count else None
    if required and nulls is not None:
        shown = nulls if hidden is None else pc.and_not(nulls, hidden)
        if pc.any(shown).as_py():
            raise DataRejectedError(
                f"field {where} is not nullable in the batch's Spark schema, but holds a "
                "null; the batch was not written",
                fix="fill the nulls (coalesce) or make the field nullable before the sink")
        array = _valid(array)
    source = array.type
    if source == kind and not pa.types.is_nested(kind):
        return array
    mask = array.is_null() if array.null_count else None
    if pa.types.is_struct(kind):
        inner = nulls if hidden is None or nulls is None else pc.or_(hidden, nulls)
        inner = hidden if inner is None else inner
        return pa.StructArray.from_arrays(
            [_written(array.field(i), field.type, not field.nullable, inner,
                      f"{where}.{field.name}".lstrip("."))
             for i, field in enumerate(kind)], fields=list(kind), mask=mask)
    if pa.types.is_map(kind):
        offsets, keys = _entries(array, array.keys)
        items = _entries(array, array.items)[1]
        return pa.MapArray.from_arrays(
            offsets, _written(keys, kind.key_type, True, None, f"{where} (key)"),
            _written(items, kind.item_type, not kind.item_field.nullable, None,
                     f"{where} (value)"), type=kind, mask=mask)
    if pa.types.is_list(kind):  # from a list, or Spark's large list (int64 offsets)
        offsets, values = _entries(array, array.values)
        return pa.ListArray.from_arrays(
            offsets, _written(values, kind.value_type, not kind.value_field.nullable, None,
                              f"{where} (element)"), type=kind, mask=mask)
    if pa.types.is_string(kind) or pa.types.is_binary(kind):  # from Spark's large types
        return array.cast(kind)
    if pa.types.is_timestamp(kind) and kind.unit == "ms" and source.unit == "us":
        micros = array.cast(pa.int64())
        truncated = pc.multiply(pc.divide(micros, 1000), 1000)
        floored = pc.if_else(pc.less(micros, truncated), pc.subtract(truncated, 1000),
                             truncated)
        return pc.divide(floored, 1000).cast(kind)
    # The same values, named otherwise: a time zone, or timestamp_ntz as INT64.
    return pa.Array.from_buffers(kind, len(array), array.buffers(), array.null_count,
                                 array.offset)


def _valid(array: pa.Array) -> pa.Array:
    """``array`` with every entry valid (the values under its nulls are never read)."""
    kind = array.type
    if pa.types.is_struct(kind):
        return pa.StructArray.from_arrays([array.field(i) for i in range(kind.num_fields)],
                                          fields=list(kind))
    if pa.types.is_list(kind) or pa.types.is_map(kind) or pa.types.is_large_list(kind):
        return pa.Array.from_buffers(kind, len(array), [None, *array.buffers()[1:2]], 0,
                                     array.offset, children=[array.values]
                                     if not pa.types.is_map(kind) else [_map_entries(array)])
    return pa.Array.from_buffers(kind, len(array), [None, *array.buffers()[1:]], 0,
                                 array.offset)


def _map_entries(array: Any) -> pa.Array:
    """The key-value structs of a map array (unsliced, as its offsets index them)."""
    return pa.StructArray.from_arrays([array.keys, array.items],
                                      fields=[array.type.key_field, array.type.item_field])


__all__ = ["CODEC", "CODEC_EXTENSIONS", "FIELD_IDS", "LEGACY_FORMAT", "ROW_METADATA_KEY",
           "SETTINGS", "TIMESTAMP_TYPE", "VERSION_KEY", "ParquetFiles", "ParquetSettings",
           "SparkParquetWriter", "active_session_settings", "parse", "read_table",
           "spark_schema_of"]
