"""Partitioned output, laid out as Spark's file sinks lay out ``.partitionBy(...)``:
``<path>/<column>=<value>/.../part-*.<ext>``, the partition columns in the directory
names and not in the files.

A value is written as Spark's ``CAST(value AS STRING)`` writes it, escaped as Spark's
``ExternalCatalogUtils.escapePathName`` escapes it (``%XX`` for ``/``, ``=``, ``:``,
``%``, quotes and control characters...); a null or empty value is the directory
``__HIVE_DEFAULT_PARTITION__``. Spark, Hive, pyarrow and pandas readers with Hive
partitioning read the columns back from the names.

Partition columns may be strings, integers, booleans, dates or decimals: their text is
the same whichever process makes it (a Spark task, or the Python data source of the
format route). Timestamps and floating-point values are refused: their text depends on
the session's time zone or on Java's number formatting, and a directory per distinct
instant is rarely what anyone wants (partition by ``to_date(ts)`` instead).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkeos.core.errors import ConfigurationError, SchemaMismatchError

DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
VALUE_COLUMN_PREFIX = "_sparkeos_pv_"
"""Columns a Spark task adds for the partition values' text (``value_expressions``);
never written."""
_ESCAPED = frozenset('"#%\'*/:=?\\\x7f{[]^') | frozenset(chr(c) for c in range(1, 0x20))
"""What Spark's ``ExternalCatalogUtils.escapePathName`` escapes."""


def escape_path_name(text: str) -> str:
    """``text`` as Spark writes it in a directory name: ``%XX`` (upper-case hex) for each
    character Spark escapes."""
    if not any(ch in _ESCAPED for ch in text):
        return text
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in text)


def unescape_path_name(text: str) -> str:
    """The inverse of ``escape_path_name``."""
    if "%" not in text:
        return text
    out, index = [], 0
    while index < len(text):
        ch = text[index]
        if ch == "%" and _is_hex(text[index + 1:index + 3]):
            out.append(chr(int(text[index + 1:index + 3], 16)))
            index += 3
        else:
            out.append(ch)
            index += 1
    return "".join(out)


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(ch in "0123456789abcdefABCDEF" for ch in text)


def normalise_columns(partition_by: str | Sequence[str] | None) -> tuple[str, ...]:
    """``partition_by`` as a tuple of column names (a comma-separated string is split,
    as the ``partitionBy`` option of the formats gives it)."""
    if not partition_by:
        return ()
    names = partition_by.split(",") if isinstance(partition_by, str) else list(partition_by)
    columns = tuple(str(name).strip() for name in names)
    if any(not name for name in columns) or len(set(columns)) != len(columns):
        raise ConfigurationError(
            f"partition_by {list(columns)!r} has an empty or repeated column name",
            fix='name each partition column once: partition_by=["date", "country"]')
    return columns


def _partitionable(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or pa.types.is_integer(kind) or pa.types.is_boolean(kind)
                or pa.types.is_date32(kind) or pa.types.is_decimal(kind))


def check_columns(columns: Sequence[str], schema: pa.Schema, where: str) -> None:
    """Refuse partition columns the batch does not have, of a type this layout does not
    write, or that would leave no column in the files."""
    names = [name for name in schema.names if not name.startswith(VALUE_COLUMN_PREFIX)]
    missing = [c for c in columns if c not in names]
    if missing:
        raise SchemaMismatchError(
            f"partition column(s) {missing} of {where} are not in the batch's columns "
            f"{names}", fix="partition by columns the query writes, or select them first")
    wrong = {c: str(schema.field(c).type) for c in columns
             if not _partitionable(schema.field(c).type)}
    if wrong:
        raise ConfigurationError(
            f"partition column(s) of {where} have types a directory name cannot hold "
            f"exactly: {wrong}",
            fix="partition by string, integer, boolean, date or decimal columns; for a "
            "timestamp, a day column: df.withColumn('day', F.to_date('ts'))")
    if len(columns) == len(names):
        raise ConfigurationError(
            f"{where} is partitioned by every column {names}: its files would hold none",
            fix="leave at least one column out of partition_by, as Spark requires")


def value_expressions(columns: Sequence[str]) -> tuple[str, ...]:
    """The Spark SQL a task's rows get for the partition values' text (Spark's own cast)."""
    return tuple(f"CAST(`{name}` AS STRING) AS {VALUE_COLUMN_PREFIX}{index}"
                 for index, name in enumerate(columns))


def directories(batch: pa.RecordBatch, columns: Sequence[str]) -> pa.Array:
    """Each row's partition directory, ``col=value/col2=value2``: from the text Spark made
    (``value_expressions``) when the batch has it, else cast here (the format route).
    Escaped once per distinct value, not per row."""
    parts = []
    for index, name in enumerate(columns):
        made = f"{VALUE_COLUMN_PREFIX}{index}"
        text = (batch.column(made) if made in batch.schema.names
                else pc.cast(batch.column(name), pa.string()))
        encoded = pc.dictionary_encode(text)
        prefix = f"{escape_path_name(name)}="
        named = pa.array([prefix + (escape_path_name(v) if v else DEFAULT_PARTITION)
                          for v in encoded.dictionary.to_pylist()], pa.string())
        parts.append(pc.fill_null(named.take(encoded.indices), prefix + DEFAULT_PARTITION))
    return pc.binary_join_element_wise(*parts, "/")


def data_columns(batch: pa.RecordBatch, columns: Sequence[str]) -> pa.RecordBatch:
    """The batch as its files hold it: without the partition columns and Spark's text of
    them."""
    keep = [i for i, name in enumerate(batch.schema.names)
            if name not in columns and not name.startswith(VALUE_COLUMN_PREFIX)]
    return pa.RecordBatch.from_arrays([batch.column(i) for i in keep],
                                      schema=pa.schema([batch.schema.field(i) for i in keep]))


def written_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch without Spark's text of the partition values: the rows a participant
    wrote, as its fingerprint counts them."""
    if not any(name.startswith(VALUE_COLUMN_PREFIX) for name in batch.schema.names):
        return batch
    return data_columns(batch, ())


def split(batch: pa.RecordBatch, columns: Sequence[str]
          ) -> Iterator[tuple[str, pa.RecordBatch]]:
    """``(directory, rows)`` for each partition directory the batch's rows fall in; rows
    keep their order within each."""
    encoded = pc.dictionary_encode(directories(batch, columns))
    codes = encoded.indices.to_numpy()
    order = np.argsort(codes, kind="stable")  # rows keep their order within a directory
    data = data_columns(batch, columns).take(pa.array(order))
    sorted_codes = codes[order]
    starts = [0, *(np.flatnonzero(sorted_codes[1:] != sorted_codes[:-1]) + 1), len(codes)]
    names = encoded.dictionary.to_pylist()
    for start, end in itertools.pairwise(starts):
        if end > start:
            yield names[sorted_codes[start]], data.slice(start, end - start)


def partition_values(relative_dir: str) -> list[tuple[str, str | None]]:
    """``[(column, value)]`` of a partition directory ``col=v/col2=w`` (unescaped; None
    for ``__HIVE_DEFAULT_PARTITION__``)."""
    values: list[tuple[str, str | None]] = []
    for part in relative_dir.split("/"):
        name, _, value = part.partition("=")
        values.append((unescape_path_name(name),
                       None if value == DEFAULT_PARTITION else unescape_path_name(value)))
    return values


def is_partition_dir(name: str) -> bool:
    """Whether a directory entry is a partition directory (``col=value``, not hidden)."""
    return "=" in name and not name.startswith((".", "_"))

