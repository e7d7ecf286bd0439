"""``mergeSchema`` for the Iceberg sink, as Spark's Delta and Iceberg writers take it: a
batch with columns the table lacks adds them to the table (by name, with new field IDs;
a column's type widened where Iceberg allows: int to long, float to double), on the
driver before any task of the batch writes; a batch without some of the table's optional
columns writes them as null. Without it, the batch's columns must be the table's.

Adding columns is a metadata commit of its own, ahead of the batch's: the batch's files
are written with the new field IDs, and a replay of the batch finds the columns there.
A required column the batch lacks, or a type Iceberg cannot widen to, is refused before
anything is written.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sparkeos.core.errors import SchemaMismatchError

from .files import normalised_schema

COMMIT_ATTEMPTS = 5
"""Schema commits tried again when another writer changed the table meanwhile."""


def merged(load: Any, identifier: str, schema: pa.Schema) -> Any:
    """The table (``load()``) with the batch's new columns added and its columns
    widened to the batch's types; as it is when nothing changes (pyiceberg commits
    nothing then)."""
    from pyiceberg.exceptions import CommitFailedException, ValidationError

    for _ in range(COMMIT_ATTEMPTS):
        table = load()
        before = table.schema()
        try:
            with table.update_schema() as update:
                update.union_by_name(normalised_schema(schema))
        except CommitFailedException:
            continue  # another writer changed the table: merge into it as it is now
        except (ValidationError, ValueError, TypeError) as exc:
            raise SchemaMismatchError(
                f"cannot add the batch's columns {schema} to the Iceberg table "
                f"{identifier}: {exc}",
                fix="cast the columns to types the table's can widen to (int to long, "
                "float to double), or write another table") from None
        if table.schema() == before:  # nothing to add or widen: no metadata commit
            return table
    return load()


def check_columns(table: Any, identifier: str, schema: pa.Schema, merge: bool) -> None:
    """The batch's columns against the table's: the same set, or with ``merge`` any of
    the table's optional columns left out (written as null)."""
    fields = table.schema().fields
    columns = [f.name for f in fields]
    if not merge:
        if set(columns) != set(schema.names):
            raise SchemaMismatchError(
                f"the Iceberg table {identifier} has the columns {columns}, the batch "
                f"{schema.names}", fix="select the table's columns, write another table, "
                "or merge the batch's schema into the table's (IcebergSink(..., "
                "merge_schema=True); the format's .option(\"mergeSchema\", \"true\"))")
        return
    extra = [name for name in schema.names if name not in columns]
    required = [f.name for f in fields if f.required and f.name not in schema.names]
    if extra or required:
        raise SchemaMismatchError(
            f"the batch's columns {schema.names} do not fit the Iceberg table "
            f"{identifier}'s {columns}: "
            + (f"{extra} are not in it; " if extra else "")
            + (f"the required {required} are not in the batch" if required else ""),
            fix="give the batch the table's required columns")


def with_missing_as_null(rows: pa.Table, target: pa.Schema) -> pa.Table:
    """``rows`` with each of ``target``'s columns they lack, null (mergeSchema)."""
    missing = [f for f in target if f.name not in rows.column_names]
    for column in missing:
        rows = rows.append_column(pa.field(column.name, column.type),
                                  pa.nulls(rows.num_rows, column.type))
    return rows


__all__ = ["COMMIT_ATTEMPTS", "check_columns", "merged", "with_missing_as_null"]
