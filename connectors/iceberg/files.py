"""The data files of an Iceberg table written by one attempt, before any snapshot
references them: Parquet files where the table's location provider puts data files
(``<table>/data/`` by default), named after the attempt's transaction ID and written
with the table's field IDs (as pyiceberg's and Spark's writers write them), and the
attempt's manifest, written ahead of each file, which lets a rollback find them without
listing the table.

``<table>/_sparkeos/attempts/<txn_id>.json``: ``{"files": [file URIs]}``. Iceberg
readers only read what the metadata names; Java Iceberg's orphan-file removal skips
directories whose names start with ``_``.

The claim, the manifest and the link into place are ``core/storage/attempts.py``'s,
shared with the Delta sink.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sparkeos.core.storage import attempts
from sparkeos.core.storage.locations import local_path

SPARKEOS_DIR = attempts.SPARKEOS_DIR


@dataclass(frozen=True)
class DataFile:
    """One written file, as the receipt names it."""

    uri: str
    """Where the table's metadata will name it (``file:///...``)."""
    size: int
    rows: int

    def as_json(self) -> dict[str, object]:
        return {"path": self.uri, "size": self.size, "rows": self.rows}

    @staticmethod
    def from_json(data: dict[str, object]) -> DataFile:
        return DataFile(str(data["path"]), int(str(data["size"])), int(str(data["rows"])))


attempts_dir = attempts.attempts_dir
manifest_path = attempts.manifest_path
claim = attempts.claim
write_manifest = attempts.write_manifest
read_manifest = attempts.read_manifest
manifests = attempts.manifests
delete_manifest = attempts.delete_manifest


def write_file(uri: str, table: pa.Table, options: dict[str, Any]) -> int | None:
    """Write one Parquet file and link it into place (``attempts.link_new``): its size,
    or None if the name exists (this attempt is a zombie of its ID)."""
    target = local_path(uri)
    temporary = attempts.temporary_for(target)
    pq.write_table(table, temporary, **options)
    return attempts.link_new(temporary, target)


def exists(uri: str) -> bool:
    return os.path.exists(local_path(uri))


def delete_files(uris: Sequence[str]) -> None:
    attempts.delete_written([local_path(uri) for uri in uris])


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
    "attempts_dir",
    "claim",
    "delete_files",
    "delete_manifest",
    "exists",
    "manifest_path",
    "manifests",
    "normalised",
    "normalised_schema",
    "read_manifest",
    "write_file",
    "write_manifest",
]
