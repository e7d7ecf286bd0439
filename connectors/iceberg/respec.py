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
import logging
import posixpath
from collections.abc import Sequence
from typing import Any

import pyarrow.parquet as pq

from sparkeos.core.errors import ConfigurationError, SchemaMismatchError
from sparkeos.core.observe import log_event

from . import catalog, partitioning, table
from .files import DataFile, TableStore


def in_spec(store: TableStore, table: Any, written: Sequence[DataFile],
            replaced: list[str]) -> list[DataFile]:
    """``written`` in the table's current spec: the files of another spec rewritten
    into it (their URIs added to ``replaced``)."""
    spec = table.spec()
    if any(not partitioning.written_for(f.spec_id, f.spec_fields, spec) for f in written):
        try:  # a spec this process cannot write (another writer chose it): said so
            partitioning.check_spec(table, ".".join(table.name()), ())
        except ConfigurationError as exc:
            raise SchemaMismatchError(
                f"the batch's files must move into the table's new partition spec: "
                f"{exc.problem}", fix=f"{exc.fix}; then restart the query or run "
                "`sparkeos recover`: the decided batch commits then") from None
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
    parts = partitioning.split(rows, spec, schema,
                               partitioning.by_field_id(rows, spec, schema))
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


def delete_replaced(store: TableStore, load: Any, replaced: Sequence[str],
                    txn: Any) -> None:
    """Delete the originals of the files a landed commit rewrote, but any a snapshot
    holds: the commit that landed may have been built for a spec the table went back to
    (it holds the originals then), and at least once an earlier commit of them may have
    landed unseen (a lost reply). Never fails the landed commit: a file left is an
    orphan."""
    try:
        kept = table.referenced(load(), replaced)
        store.delete_files([uri for uri in replaced if uri not in kept])
    except Exception as exc:
        log_event("iceberg.cleanup_failed", logging.WARNING, sink=txn.sink,
                  batch=txn.batch_id, cause=str(exc))


__all__ = ["delete_replaced", "in_spec"]
