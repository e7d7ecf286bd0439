"""The data files of a Delta table written by one attempt, before any commit references
them: Parquet files inside the table's directory (in ``col=value/`` directories for a
partitioned table, as Spark's and delta-rs' writers lay them out), named after the
attempt's transaction ID, and the attempt's manifest, written ahead of each file, that
lets a rollback find them without listing the table.

``<table>/_sparkeos/attempts/<txn_id>.json``: ``{"files": [relative paths]}``. Delta
ignores directories whose names start with ``_`` (readers and VACUUM alike).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.storage import attempts
from sparkeos.core.storage.attempts import TableFiles
from sparkeos.core.text.sparktext import escape_path_name

SPARKEOS_DIR = attempts.SPARKEOS_DIR
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"


@dataclass(frozen=True)
class DataFile:
    """One written file, as a Delta add action names it."""

    path: str
    """Relative to the table's root, ``/``-separated."""
    size: int
    partition_values: dict[str, str | None]
    rows: int

    def as_json(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size,
                "partition_values": self.partition_values, "rows": self.rows}

    @staticmethod
    def from_json(data: dict[str, object]) -> DataFile:
        values = data["partition_values"]
        assert isinstance(values, dict)
        return DataFile(str(data["path"]), int(str(data["size"])),
                        {str(k): (None if v is None else str(v)) for k, v in values.items()},
                        int(str(data["rows"])))


PARTITION_TYPES = "strings, integers, booleans and dates"


def check_partition_column(name: str, kind: pa.DataType) -> None:
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_integer(kind) or pa.types.is_boolean(kind)
            or pa.types.is_date32(kind)):
        raise ConfigurationError(
            f"partition column {name!r} is of type {kind}: the Delta sink partitions by "
            f"{PARTITION_TYPES} so far",
            fix=f"partition by a column of those types (e.g. a date cast from {name!r})")


def value_text(value: object) -> str | None:
    """A partition value as Delta's add action and the directory name spell it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return str(value)


def split_by_partition(table: pa.Table, columns: Sequence[str]
                       ) -> Iterator[tuple[dict[str, str | None], pa.Table]]:
    """The rows per partition (partition columns dropped, as Delta stores them only in
    the log)."""
    if not columns:
        yield {}, table
        return
    keys = table.select(list(columns)).group_by(list(columns)).aggregate([]).to_pylist()
    data = table.drop_columns(list(columns))
    for key in keys:
        mask = None
        for column in columns:
            value = key[column]
            this = (pc.is_null(table[column]) if value is None
                    else pc.equal(table[column], pa.scalar(value, table.schema.field(column).type)))
            mask = this if mask is None else pc.and_(mask, this)
        yield ({c: value_text(key[c]) for c in columns}, data.filter(mask))


def partition_dir(values: dict[str, str | None]) -> str:
    return "/".join(f"{escape_path_name(column)}="
                    f"{DEFAULT_PARTITION if value is None else escape_path_name(value)}"
                    for column, value in values.items())


def write_file(where: TableFiles, relative: str, table: pa.Table) -> int | None:
    """Write one Parquet file into place, never over a file there
    (``TableFiles.write_new``): its size, or None if the name exists (this attempt is a
    zombie of its ID). Decimals as integers where they fit (INT32 up to 9 digits, INT64
    up to 18), as Spark's Parquet writer and delta-rs write them."""
    return where.write_new(relative, lambda temporary: pq.write_table(
        table, temporary, store_decimal_as_integer=True))


def normalised(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch in the types a Delta table holds: timestamps in microseconds (in UTC
    where they have a zone: Spark hands them in the session's), plain strings and
    binaries."""
    fields = [pa.field(f.name, _delta_type(f.type), f.nullable) for f in batch.schema]
    schema = pa.schema(fields)
    return batch if schema.equals(batch.schema) else batch.cast(schema, safe=False)


def _delta_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(kind):
        return pa.timestamp("us", tz="UTC" if kind.tz else None)
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind):
        return pa.binary()
    return kind


__all__ = [
    "DEFAULT_PARTITION",
    "SPARKEOS_DIR",
    "DataFile",
    "check_partition_column",
    "normalised",
    "partition_dir",
    "split_by_partition",
    "value_text",
    "write_file",
]
