"""How the Iceberg sink partitions its rows: the table's partition spec (Iceberg's
hidden partitioning), which the sink follows as every Iceberg writer does, or, for a
table the sink makes, the spec ``partition_by`` names in Spark SQL's spellings
(``PARTITIONED BY (days(at), bucket(16, id), region)``).

- ``parse``: ``partition_by``'s entries, checked when the sink is made;
- ``check_spec``: a table's spec against ``partition_by``, and that each of its
  transforms can be computed here (pyiceberg-core computes the time, bucket and truncate
  transforms), before anything is written;
- ``split``: one batch's rows by partition, each part with its partition key (its
  values, the data file's ``partition`` record, and its path under the table's data);
- ``encode``/``decode``: a partition record in the receipt, as Iceberg's single-value
  serialization of each value (the commit rebuilds exactly what phase 1 computed: no
  guess from a file's column statistics, which Iceberg truncates for long strings).

pyiceberg's own writer splits rows by comparing each partition's value, which a NaN
never equals: its append of a NaN in an identity partition of a float fails (0.12). The
split here groups rows as Arrow's hash grouping does (NaN with NaN) and checks that every
row went into one part.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkeos.core.errors import ConfigurationError, SchemaMismatchError

_SPELLINGS = {"years": "year", "year": "year", "months": "month", "month": "month",
              "days": "day", "day": "day", "date": "day", "hours": "hour", "hour": "hour",
              "date_hour": "hour", "bucket": "bucket", "truncate": "truncate",
              "identity": "identity"}
_WIDTH = {"bucket", "truncate"}
_JAVA_SUFFIX = {"year": "_year", "month": "_month", "day": "_day", "hour": "_hour",
                "bucket": "_bucket", "truncate": "_trunc"}
_CALL = re.compile(r"^\s*(\w+)\s*\(\s*(?:(\d+)\s*,\s*)?([^(),\s]+)\s*\)\s*$")
EXAMPLE = 'partition_by=("region", "days(at)", "bucket(16, id)")'


@dataclass(frozen=True)
class PartitionColumn:
    """One partition field: a source column and the transform applied to it."""

    source: str
    transform: str
    """pyiceberg's spelling: ``identity``, ``day``, ``bucket[16]``, ``truncate[4]``..."""

    @property
    def name(self) -> str:
        """The partition field's name as Iceberg's Java builder (and so Spark) gives it:
        the column for identity, ``<column>_day``, ``<column>_bucket``, ``<column>_trunc``."""
        kind = self.transform.split("[")[0]
        return self.source + _JAVA_SUFFIX.get(kind, "")

    def shown(self) -> str:
        kind, _, width = self.transform.partition("[")
        if kind == "identity":
            return self.source
        return f"{kind}({width.rstrip(']')}, {self.source})" if width else \
            f"{kind}({self.source})"


def parse(entries: Sequence[str]) -> tuple[PartitionColumn, ...]:
    """``partition_by``'s entries: a column (identity), or a transform of one."""
    parsed = []
    for entry in entries:
        if not isinstance(entry, str) or not entry.strip():
            raise ConfigurationError(f"partition_by entry {entry!r} is not a column or a "
                                     "transform of one", fix=EXAMPLE)
        call = _CALL.match(entry)
        if call is None:
            if not re.fullmatch(r"[^(),\s]+", entry.strip()):
                raise ConfigurationError(
                    f"partition_by entry {entry!r} is neither a column nor a transform "
                    "(years, months, days, hours, bucket(N, col), truncate(W, col))",
                    fix=EXAMPLE)
            parsed.append(PartitionColumn(entry.strip(), "identity"))
            continue
        spelled, width, source = call.groups()
        kind = _SPELLINGS.get(spelled.lower())
        if kind is None or (kind in _WIDTH) != (width is not None):
            raise ConfigurationError(
                f"partition_by entry {entry!r}: {spelled}(...) is not an Iceberg "
                "transform the sink knows (years, months, days, hours, bucket(N, col), "
                "truncate(W, col))", fix=EXAMPLE)
        if width is not None and int(width) <= 0:
            raise ConfigurationError(f"partition_by entry {entry!r}: the width must be "
                                     "positive", fix=EXAMPLE)
        parsed.append(PartitionColumn(source, f"{kind}[{int(width)}]" if width else kind))
    sources = [p.source for p in parsed]
    if len(set(sources)) != len(sources):
        raise ConfigurationError(
            f"partition_by {list(entries)} partitions one column twice, which pyiceberg's "
            "partition keys (the sink's) cannot hold", fix="one transform per column")
    return tuple(parsed)


def split_option(text: str | None) -> tuple[str, ...]:
    """The format's ``sparkeos.partitionBy``: entries separated by commas outside
    parentheses (``"region, bucket(16, id)"``)."""
    if not text:
        return ()
    entries, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            entries.append(current.strip())
            current = ""
        else:
            current += char
    entries.append(current.strip())
    return tuple(e for e in entries if e)


def columns_of(table: Any) -> tuple[PartitionColumn, ...]:
    """The table's current partition spec in the sink's terms."""
    schema = table.schema()
    return tuple(PartitionColumn(str(schema.find_column_name(f.source_id)), str(f.transform))
                 for f in table.spec().fields)


def create_spec(transaction: Any, wanted: Sequence[PartitionColumn]) -> None:
    """Give a table being created (in ``transaction``) the spec ``wanted``, with the
    field names Iceberg's Java builder gives."""
    from pyiceberg.transforms import parse_transform

    if not wanted:
        return
    try:
        with transaction.update_spec() as update:
            for column in wanted:
                update.add_field(column.source, parse_transform(column.transform),
                                 column.name)
    except (ValueError, TypeError) as exc:  # a transform of a type it does not take...
        raise ConfigurationError(
            f"cannot partition a table by {[c.shown() for c in wanted]}: {exc}",
            fix="change partition_by: identity of a primitive column, years/months/days/"
            "hours of a date or timestamp, bucket of an integer, decimal, date, "
            "timestamp, string or binary, truncate of an integer, decimal, string or "
            "binary; field names must not clash with columns") from None


def check_spec(table: Any, identifier: str, wanted: Sequence[PartitionColumn]) -> None:
    """Refuse a table partitioned otherwise than ``wanted`` (when given), or by a
    transform this process cannot compute."""
    have = columns_of(table)
    if wanted and [(c.source, c.transform) for c in have] != \
            [(c.source, c.transform) for c in wanted]:
        raise ConfigurationError(
            f"the Iceberg table {identifier} is partitioned by "
            f"{[c.shown() for c in have] or 'nothing'}, the sink by "
            f"{[c.shown() for c in wanted]}",
            fix=f"partition_by={tuple(c.shown() for c in have)!r} (or leave it out: the "
            "sink follows the table's own spec), or another table")
    schema = table.schema()
    top_level = {f.name for f in schema.fields}
    sources = [f.source_id for f in table.spec().fields]
    if len(set(sources)) != len(sources):
        raise ConfigurationError(
            f"the Iceberg table {identifier} is partitioned by two transforms of one "
            f"column ({[c.shown() for c in have]}), which pyiceberg's partition keys (the "
            "sink's) cannot hold", fix="write a table with one transform per column")
    for field in table.spec().fields:
        source = schema.find_field(field.source_id)
        if str(field.transform).startswith("bucket") and str(source.field_type) == "time":
            raise ConfigurationError(
                f"the Iceberg table {identifier} buckets the time column {source.name}, "
                "which pyiceberg cannot compute (its own append fails the same way)",
                fix="bucket another column, or partition by hours of a timestamp")
        if schema.find_column_name(field.source_id) not in top_level:
            raise ConfigurationError(
                f"the Iceberg table {identifier} is partitioned by a field inside a "
                f"struct ({field.name} of {schema.find_column_name(field.source_id)})",
                fix="partition the table by top-level columns")
        try:
            field.transform.pyarrow_transform(source.field_type)
        except (ModuleNotFoundError, NotImplementedError, ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"the Iceberg table {identifier}'s partition field {field.name} "
                f"({field.transform} of {source.name}) cannot be computed here: {exc}",
                fix="install pyiceberg-core (pip install 'sparkeos[iceberg]' brings it)"
                if isinstance(exc, ModuleNotFoundError) else "write a table partitioned "
                "by transforms pyiceberg computes (identity, years, months, days, hours, "
                "bucket, truncate)") from None


def check_sources(wanted: Sequence[PartitionColumn], schema: pa.Schema) -> None:
    """Each of ``partition_by``'s columns is one of the batch's."""
    for column in wanted:
        if column.source not in schema.names:
            raise ConfigurationError(
                f"partition column {column.source!r} ({column.shown()}) is not a column of "
                f"the batch ({', '.join(schema.names)})",
                fix="partition by a column the stream has")


def check_mergeable(table: Any, identifier: str) -> None:
    """An upsert's rows go in through pyiceberg's own writer, which splits rows by
    comparing partition values: a NaN in an identity partition of a float would fail
    the decided merge (pyiceberg 0.12). Such a table is refused for upserts up front."""
    schema = table.schema()
    for field in table.spec().fields:
        source = schema.find_field(field.source_id)
        if str(field.transform) == "identity" and str(source.field_type) in ("float",
                                                                            "double"):
            raise ConfigurationError(
                f"the Iceberg table {identifier} is partitioned by the float column "
                f"{source.name}: an upsert's merge goes through pyiceberg's writer, which "
                "cannot put a NaN in such a partition",
                fix="partition by another column (or bucket the key), or append instead "
                "of upserting")


@dataclass(frozen=True)
class Part:
    """The rows of one partition and its key (None for an unpartitioned table)."""

    key: Any
    rows: pa.Table


def split(rows: pa.Table, spec: Any, schema: Any, sources: pa.Table | None = None
          ) -> list[Part]:
    """``rows`` (in the table's schema) by the partition ``spec`` of the Iceberg
    ``schema``: every row in exactly one part. ``sources``: the same rows under the
    schema's current names (``by_field_id``), where ``rows`` are a file's as written."""
    if spec.is_unpartitioned():
        return [Part(None, rows)]
    from pyiceberg.partitioning import PartitionFieldValue, PartitionKey

    named = rows if sources is None else sources

    names = [f"_sparkeos_partition_{i}" for i in range(len(spec.fields))]
    keyed = rows
    for field, name in zip(spec.fields, names, strict=True):
        source = schema.find_field(field.source_id)
        column = named.column(str(schema.find_column_name(field.source_id)))
        value = field.transform.pyarrow_transform(source.field_type)(column)
        if pa.types.is_floating(value.type):  # every NaN one group, whatever its bits
            value = pc.if_else(pc.is_nan(value), pa.scalar(math.nan, value.type), value)
        keyed = keyed.append_column(name, value)
    keyed = keyed.append_column("_sparkeos_row", pa.array(range(rows.num_rows), pa.int64()))
    groups = keyed.group_by(names, use_threads=False).aggregate([("_sparkeos_row", "list")])
    parts = []
    for group in groups.to_pylist():
        key = PartitionKey(
            field_values=[PartitionFieldValue(field=field, value=group[name])
                          for field, name in zip(spec.fields, names, strict=True)],
            partition_spec=spec, schema=schema)
        parts.append(Part(key, rows.take(group["_sparkeos_row_list"])))
    if sum(part.rows.num_rows for part in parts) != rows.num_rows:
        raise SchemaMismatchError(  # never: a row in no part would be lost
            f"splitting {rows.num_rows} rows by the partition spec {spec} gave "
            f"{sum(p.rows.num_rows for p in parts)}", fix="report this as a bug")
    return parts


def by_field_id(rows: pa.Table, spec: Any, schema: Any) -> pa.Table:
    """A data file's ``rows`` under the Iceberg ``schema``'s current names, found by
    each column's field ID (another writer may have renamed or swapped columns since
    the file was written); a partition source the file lacks (added since) is null, as
    Iceberg reads a column a file lacks."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    columns, names = [], []
    for position, column in enumerate(rows.schema):
        field_id = (column.metadata or {}).get(b"PARQUET:field_id")
        name = schema.find_column_name(int(field_id)) if field_id is not None else None
        if name is not None:
            columns.append(rows.column(position))
            names.append(name)
    for field in spec.fields:
        name = schema.find_column_name(field.source_id)
        if name not in names:
            kind = schema_to_pyarrow(schema.find_field(field.source_id).field_type)
            columns.append(pa.nulls(rows.num_rows, kind))
            names.append(name)
    return pa.table(columns, names=names)


def fingerprint(spec: Any) -> str:
    """A spec's fields (source column ID, partition field ID, transform), as a receipt
    records them."""
    return ";".join(f"{f.source_id}:{f.field_id}:{f.transform}" for f in spec.fields)


def written_for(spec_id: int | None, spec_fields: str | None, spec: Any) -> bool:
    """Whether a file written for the spec ``spec_id`` (with the fields ``spec_fields``;
    None: from a receipt that did not record them) belongs to ``spec``."""
    if spec_id is None:  # a receipt of a version that wrote unpartitioned tables only
        return bool(spec.is_unpartitioned())
    return spec_id == spec.spec_id and spec_fields in (None, fingerprint(spec))


def encode(key: Any) -> list[str | None]:
    """The partition record of ``key`` as Iceberg serializes single values (hex)."""
    if key is None:
        return []
    from pyiceberg.conversions import to_bytes

    record = key.partition
    encoded: list[str | None] = []
    for position, field in enumerate(key.partition_spec.fields):
        value = record[position]
        kind = field.transform.result_type(key.schema.find_field(field.source_id).field_type)
        encoded.append(None if value is None else to_bytes(kind, value).hex())
    return encoded


def decode(encoded: Sequence[str | None], spec: Any, schema: Any) -> Any:
    """The data file's partition record from ``encode``'s values."""
    from pyiceberg.conversions import from_bytes
    from pyiceberg.typedef import Record

    values = []
    for value, field in zip(encoded, spec.fields, strict=True):
        kind = field.transform.result_type(schema.find_field(field.source_id).field_type)
        values.append(None if value is None else from_bytes(kind, bytes.fromhex(value)))
    return Record(*values)


__all__ = [
    "EXAMPLE",
    "Part",
    "PartitionColumn",
    "check_mergeable",
    "check_sources",
    "check_spec",
    "columns_of",
    "create_spec",
    "decode",
    "encode",
    "fingerprint",
    "parse",
    "split",
    "split_option",
    "written_for",
]
