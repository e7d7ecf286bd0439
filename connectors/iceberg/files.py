"""The data files of an Iceberg table written by one attempt, before any snapshot
references them: Parquet files where the table's location provider puts data files
(``<table>/data/`` by default), named after the attempt's transaction ID and written
with the table's field IDs (as pyiceberg's and Spark's writers write them), and the
attempt's manifest, written ahead of each file, which lets a rollback find them without
listing the table.

``<table>/_sparkeos/attempts/<txn_id>.json``: ``{"files": [file URIs]}``. Iceberg
readers only read what the metadata names; Java Iceberg's orphan-file removal skips
directories whose names start with ``_``.

The claim, the manifest and the link-into-place mirror ``connectors/delta/files.py``
(connectors do not import each other): the same mechanism, kept apart until it moves
into the core's storage room.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sparkeos.core.storage.locations import local_path

SPARKEOS_DIR = "_sparkeos"


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


def attempts_dir(root: str) -> str:
    return os.path.join(root, SPARKEOS_DIR, "attempts")


def manifest_path(root: str, txn_id: str) -> str:
    return os.path.join(attempts_dir(root), f"{txn_id}.json")


def claim(root: str, txn_id: str) -> bool:
    """Create the attempt's manifest if no attempt of this ID has one (exclusive:
    two attempts of one ID at once, one wins)."""
    target = manifest_path(root, txn_id)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        json.dump({"files": []}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    return True


def write_manifest(root: str, txn_id: str, uris: Sequence[str]) -> None:
    """Replace the attempt's manifest (durable before the file it names is written)."""
    target = manifest_path(root, txn_id)
    temporary = f"{target}.tmp"
    with open(temporary, "w") as fh:
        json.dump({"files": list(uris)}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temporary, target)


def read_manifest(root: str, txn_id: str) -> list[str] | None:
    try:
        with open(manifest_path(root, txn_id)) as fh:
            return [str(p) for p in json.load(fh)["files"]]
    except FileNotFoundError:
        return None


def manifests(root: str) -> set[str]:
    """The transaction IDs that have a manifest (one listing of the directory)."""
    try:
        names = os.listdir(attempts_dir(root))
    except FileNotFoundError:
        return set()
    return {name[: -len(".json")] for name in names if name.endswith(".json")}


def delete_manifest(root: str, txn_id: str) -> None:
    for path in (manifest_path(root, txn_id), f"{manifest_path(root, txn_id)}.tmp"):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def write_file(uri: str, table: pa.Table, options: dict[str, Any]) -> int | None:
    """Write and fsync one Parquet file under a temporary name, then link it into
    place, which never replaces a file: None if the name exists (a file of the same
    attempt ID is there already, perhaps committed: this attempt is a zombie)."""
    target = local_path(uri)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    temporary = f"{target}.{os.getpid()}.tmp"
    pq.write_table(table, temporary, **options)
    try:
        with open(temporary, "rb") as fh:
            os.fsync(fh.fileno())
        try:
            os.link(temporary, target)
        except FileExistsError:
            return None
        return os.path.getsize(target)
    finally:
        os.remove(temporary)


def exists(uri: str) -> bool:
    return os.path.exists(local_path(uri))


def delete_files(uris: Sequence[str]) -> None:
    for uri in uris:
        target = local_path(uri)
        for path in [target, *glob.glob(glob.escape(target) + ".*.tmp")]:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass


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
