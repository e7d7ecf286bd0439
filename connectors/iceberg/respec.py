"""A decided batch's files moved into the table's partition spec of the moment of its
commit. Each task writes for the spec it found when it began; another writer may evolve
the table's partitioning before the batch commits, or between two tasks of one batch.
pyiceberg's fast append writes its files into one manifest of the table's current spec,
so a file of another spec is rewritten: its rows split by the current spec, each part
written (never over a file there) as ``<file's name>-spec<ID>-<n>.parquet`` under its
partition's path. The names are fixed by the file, the spec and the parts' partition
records, so a twin committer, or
a retry after a crash, finds the part already there and takes it as it is (it holds the
same rows: the split is a function of them).

The originals are deleted once the commit that replaced them landed; a crash before
leaves them unreferenced (Iceberg's orphan-file removal takes them), never referenced
twice.
"""

from __future__ import annotations

import io
import posixpath
from collections.abc import Sequence
from typing import Any

import pyarrow.parquet as pq

from sparkeos.core.errors import SchemaMismatchError

from . import catalog, partitioning
from .files import DataFile, TableStore


def in_spec(store: TableStore, table: Any, written: Sequence[DataFile],
            replaced: list[str]) -> list[DataFile]:
    """``written`` in the table's current spec: the files of another spec rewritten
    into it (their URIs added to ``replaced``)."""
    spec = table.spec()
    found: list[DataFile] = []
    for data_file in written:
        if partitioning.written_for(data_file.spec_id, data_file.spec_fields, spec):
            found.append(data_file)
            continue
        found.extend(_rewritten(store, table, data_file))
        replaced.append(data_file.uri)
    return found


def _rewritten(store: TableStore, table: Any, data_file: DataFile) -> list[DataFile]:
    spec, schema = table.spec(), table.schema()
    rows = pq.read_table(io.BytesIO(store.read(data_file.uri)))
    try:
        parts = partitioning.split(rows, spec, schema)
    except KeyError as exc:
        raise SchemaMismatchError(
            f"the data file {data_file.uri} lacks the column {exc} that the Iceberg table "
            f"{'.'.join(table.name())}'s partition spec ({spec}) now partitions by",
            fix="restore the table's partitioning as it was when the batch was written, "
            "then restart the query or run `sparkeos recover`") from None
    stem = posixpath.basename(data_file.uri).removesuffix(".parquet")
    provider = table.location_provider()
    options = catalog.parquet_options(table)
    moved = []
    # Numbered in the order of their partition records, not of the split: a location
    # provider without partition paths names every part's file in one directory.
    ordered = sorted(parts, key=lambda part: repr(partitioning.encode(part.key)))
    for number, part in enumerate(ordered):
        name = f"{stem}-spec{spec.spec_id}-{number:05d}.parquet"
        uri = str(provider.new_data_location(name, part.key))
        size = store.write_file(uri, part.rows, options)  # None: a twin wrote it first
        moved.append(DataFile(uri, size or 0, part.rows.num_rows,
                              tuple(partitioning.encode(part.key)), spec.spec_id,
                              partitioning.fingerprint(spec)))
    return moved


__all__ = ["in_spec"]
