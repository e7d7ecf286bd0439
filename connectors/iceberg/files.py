"""The data files of an Iceberg table written by one attempt, before any snapshot
references them: Parquet files where the table's location provider puts data files
(``<table>/data/`` by default), named after the attempt's transaction ID and written
with the table's field IDs (as pyiceberg's and Spark's writers write them), and the
attempt's manifest, written ahead of each file, which lets a rollback find them without
listing the table.

``<table>/_sparkeos/attempts/<txn_id>.json``: ``{"files": [file URIs]}``. Iceberg
readers only read what the metadata names; Java Iceberg's orphan-file removal skips
directories whose names start with ``_``.

The claim, the manifest and the write into place are ``core/storage/attempts.py``'s
(``TableFiles``), shared with the Delta sink: on a local path, or on an object store
(S3, GCS, Azure) by the store's create-if-absent. ``root`` is the table's location as
``table_location`` gives it (a local path, or the object store's URI).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sparkeos.core.storage import attempts
from sparkeos.core.storage.attempts import TableFiles
from sparkeos.core.storage.files import S3_SCHEMES, Files
from sparkeos.core.storage.locations import parse as parse_location
from sparkeos.core.storage.registry import split_uri

SPARKEOS_DIR = attempts.SPARKEOS_DIR


@dataclass(frozen=True)
class DataFile:
    """One written file, as the receipt names it."""

    uri: str
    """Where the table's metadata will name it (``file:///...``)."""
    size: int
    rows: int
    partition: tuple[str | None, ...] = ()
    """Its partition record (``partitioning.encode``); empty when unpartitioned."""
    spec_id: int | None = None
    """The partition spec it was written for; None in a receipt of a version that wrote
    unpartitioned tables only."""
    spec_fields: str | None = None
    """That spec's fields (``partitioning.fingerprint``): a table made again under the
    same name may give its spec the same ID."""

    def as_json(self) -> dict[str, object]:
        return {"path": self.uri, "size": self.size, "rows": self.rows,
                "partition": list(self.partition), "spec": self.spec_id,
                "spec_fields": self.spec_fields}

    @staticmethod
    def from_json(data: dict[str, Any]) -> DataFile:
        spec = data.get("spec")
        fields = data.get("spec_fields")
        return DataFile(str(data["path"]), int(str(data["size"])), int(str(data["rows"])),
                        tuple(data.get("partition") or ()),
                        None if spec is None else int(spec),
                        None if fields is None else str(fields))


def table_location(location: str) -> str:
    """A table's location as the sink keeps it: a local path for a local table (as
    before: ``file:`` dropped), the URI as it is on an object store."""
    parsed = parse_location(location)
    if parsed.is_local:
        return parsed.path if parsed.scheme == "file" else location
    return location


@dataclass(frozen=True)
class TableStore:
    """Where the sink's tables are, resolved on the driver and pickled with the sink:
    ``warehouse``, the store of the catalog's warehouse (None for a local one), serves
    every location in its bucket (S3: any of ``s3``, ``s3a``, ``s3n``) or container (as
    the warehouse spells it: another spelling is refused in ``validate``), so the tasks
    reach the store the driver resolved whatever their environment (as the Delta and
    file sinks' stores); a location elsewhere is resolved where it is used."""

    warehouse: Files | None = None

    def _split(self, location: str) -> tuple[Files, str]:
        parsed = parse_location(location)
        known = self.warehouse
        if known is not None and not parsed.is_local:
            # s3://, s3a:// and s3n:// name one bucket alike (Spark writes s3://, S3A
            # s3a://); on GCS and Azure the URI of the same bucket or container
            home = parse_location(known.uri("/"))
            both = {parsed.scheme, home.scheme}
            same_kind = len(both) == 1 or both <= set(S3_SCHEMES)
            if same_kind and parsed.authority == home.authority:
                return known, parsed.normalized_path()
        return split_uri(location)

    def table_files(self, root: str) -> TableFiles:
        return TableFiles(*self._split(root))

    def claim(self, root: str, txn_id: str) -> bool:
        return self.table_files(root).claim(txn_id)

    def write_manifest(self, root: str, txn_id: str, names: Sequence[str]) -> None:
        self.table_files(root).write_manifest(txn_id, names)

    def read_manifest(self, root: str, txn_id: str) -> list[str] | None:
        return self.table_files(root).read_manifest(txn_id)

    def manifests(self, root: str) -> set[str]:
        return self.table_files(root).manifests()

    def delete_manifest(self, root: str, txn_id: str) -> None:
        self.table_files(root).delete_manifest(txn_id)

    def _beside(self, uri: str) -> tuple[TableFiles, str]:
        """The file at ``uri`` as (its directory, its name)."""
        store, path = self._split(uri)
        split = os.path if store.is_local else posixpath
        return TableFiles(store, split.dirname(path)), split.basename(path)

    def write_file(self, uri: str, table: pa.Table, options: dict[str, Any]) -> int | None:
        """Write one Parquet file into place, never over a file there
        (``TableFiles.write_new``): its size, or None if the name exists (this attempt is
        a zombie of its ID)."""
        directory, name = self._beside(uri)
        return directory.write_new(
            name, lambda temporary: pq.write_table(table, temporary, **options))

    def exists(self, uri: str) -> bool:
        directory, name = self._beside(uri)
        return directory.exists(name)

    def read(self, uri: str) -> bytes:
        directory, name = self._beside(uri)
        return directory.read(name)

    def delete_files(self, uris: Sequence[str]) -> None:
        for uri in uris:
            directory, name = self._beside(uri)
            directory.delete([name])




def normalised(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with timestamps in microseconds (in UTC where they have a zone: Spark
    hands them in the session's), the rule of ``connectors/delta/files.normalised``:
    Iceberg's ``timestamp`` and ``timestamptz`` are microseconds. The cast to the
    table's own Arrow schema does the rest (narrow integers to ``int``, strings)."""
    fields = [pa.field(f.name, _micros(f.type), f.nullable) for f in batch.schema]
    schema = pa.schema(fields)
    return batch if schema.equals(batch.schema) else batch.cast(schema, safe=False)


def normalised_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, _micros(f.type), f.nullable) for f in schema])


def _micros(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(kind):
        return pa.timestamp("us", tz="UTC" if kind.tz else None)
    if pa.types.is_string_view(kind):
        return pa.string()
    if pa.types.is_binary_view(kind):
        return pa.binary()
    return kind


__all__ = [
    "SPARKEOS_DIR",
    "DataFile",
    "TableStore",
    "normalised",
    "normalised_schema",
    "table_location",
]
