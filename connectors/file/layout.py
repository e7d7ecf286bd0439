"""Partitioned output, laid out as Spark's file sinks lay out ``.partitionBy(...)``:
``<path>/<column>=<value>/.../part-*.<ext>``, the partition columns in the directory
names and not in the files.

A directory's name is Spark's (``core/text/sparktext.py`` decides it for both routes, in the
task, from the Arrow batch): the value as Spark's ``CAST(value AS STRING)`` writes it
in the session's time zone and settings, escaped as Spark's
``ExternalCatalogUtils.escapePathName`` escapes it (``%XX`` for ``/``, ``=``, ``:``,
``%``, quotes and control characters...); a null or empty value is the directory
``__HIVE_DEFAULT_PARTITION__``. Spark, Hive, pyarrow and pandas readers with Hive
partitioning read the columns back from the names.

Partition columns may be of every type Spark's ``partitionBy`` takes except floating
point and intervals, whose text sparkeos cannot reproduce (``sparktext.partition_refusal``
says why): strings, binary, integers, booleans, decimals, dates, timestamps and
timestamp_ntz.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkeos.core.errors import ConfigurationError, SchemaMismatchError
from sparkeos.core.text.sparktext import (
    DEFAULT_PARTITION,
    SessionText,
    escape_path_name,
    partition_names,
    partition_refusal,
    unescape_path_name,
)

__all__ = ["DEFAULT_PARTITION", "check_columns", "data_columns", "directories",
           "escape_path_name", "is_partition_dir", "normalise_columns",
           "partition_values", "split", "unescape_path_name"]


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


def check_columns(columns: Sequence[str], schema: pa.Schema, where: str) -> None:
    """Refuse partition columns the batch does not have, of a type whose directory name
    sparkeos cannot write as Spark does, or that would leave no column in the files."""
    names = list(schema.names)
    missing = [c for c in columns if c not in names]
    if missing:
        raise SchemaMismatchError(
            f"partition column(s) {missing} of {where} are not in the batch's columns "
            f"{names}", fix="partition by columns the query writes, or select them first")
    for column in columns:
        why = partition_refusal(schema.field(column).type)
        if why:
            raise ConfigurationError(
                f"partition column {column!r} of {where} is of type "
                f"{schema.field(column).type}, whose directory names sparkeos does not "
                f"write as Spark does: {why}",
                fix=f"partition by the column's text as Spark casts it: "
                f"df.withColumn('{column}', F.col('{column}').cast('string')) (the same "
                "directory names as Spark's partitionBy of the column)")
    if len(columns) == len(names):
        raise ConfigurationError(
            f"{where} is partitioned by every column {names}: its files would hold none",
            fix="leave at least one column out of partition_by, as Spark requires")


def directories(batch: pa.RecordBatch, columns: Sequence[str]) -> pa.Array:
    """Each row's partition directory, ``col=value/col2=value2``: named once per
    distinct value (``sparktext.partition_names``), not per row."""
    session = SessionText.current()
    parts = []
    for name in columns:
        encoded = pc.dictionary_encode(batch.column(name))
        named = pa.array(partition_names(name, encoded.dictionary, session), pa.string())
        parts.append(pc.fill_null(named.take(encoded.indices),
                                  f"{escape_path_name(name)}={DEFAULT_PARTITION}"))
    return pc.binary_join_element_wise(*parts, "/")


def data_columns(batch: pa.RecordBatch, columns: Sequence[str]) -> pa.RecordBatch:
    """The batch as its files hold it: without the partition columns."""
    keep = [i for i, name in enumerate(batch.schema.names) if name not in columns]
    return pa.RecordBatch.from_arrays([batch.column(i) for i in keep],
                                      schema=pa.schema([batch.schema.field(i) for i in keep]))


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
    """Whether a directory entry is a partition directory, as Spark's file index tells
    (``col=value``; a hidden ``.`` name never, a ``_`` name only with an ``=``: the
    directories of a column ``_day`` are partitions, ``_temporary`` is not)."""
    return "=" in name and not name.startswith(".")
