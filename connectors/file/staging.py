"""Phase 1 of the file sink: an attempt's part files, written and made durable in its
staging directory (one file, or one per partition directory of partitioned output)."""

from __future__ import annotations

import dataclasses
import os
import posixpath
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkeos.core.protocol import Transaction
from sparkeos.core.snapshot.fingerprint import Fingerprint
from sparkeos.core.storage.files import Files
from sparkeos.core.text.sparkjson import json_lines_buffer

from .parquet import ParquetFiles

PREPARED_MARK = ".prepared"
"""In a partitioned attempt's staging directory: all its part files are durable."""


@dataclass
class StagedPart:
    """An attempt's staging: its directory, its part file's name and writers (one per
    partition directory, ``""`` for unpartitioned output)."""

    txn: Transaction
    directory: str
    """The attempt's staging directory, in the sink's file system."""
    file_name: str
    local_dir: str
    """Where the part file is written: ``directory`` itself on a POSIX path, a
    temporary directory on this host for HDFS (made with the first row, uploaded at
    prepare; empty until then)."""
    writers: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The writer of each partition directory's part file (``""``: the output's root)."""
    rows: int = 0
    content: Fingerprint = dataclasses.field(default_factory=Fingerprint)


def open_writer(part: StagedPart, schema: pa.Schema, parquet: ParquetFiles | None,
                directory: str = "") -> Any:
    """A writer of ``part``'s file (in partition ``directory`` of partitioned output):
    Parquet as Spark writes it (``parquet``), else JSON Lines."""
    if not part.local_dir:
        part.local_dir = tempfile.mkdtemp(prefix="sparkeos-part-")
    target = os.path.join(part.local_dir, directory, part.file_name)
    if directory:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    if parquet is not None:
        return parquet.writer(target, schema)
    return open(target, "wb")


def write_rows(writer: Any, format: str, rows: pa.RecordBatch) -> None:
    if format == "parquet":
        writer.write_batch(rows)
    else:
        writer.write(json_lines(rows))


def json_lines(batch: pa.RecordBatch) -> pa.Buffer:
    """The batch's rows as Spark's JSON writer writes them (``core/text/sparkjson.py``)."""
    return json_lines_buffer(batch)


def finish(part: StagedPart, files: Files, fsync: bool, partitioned: bool) -> list[str]:
    """Each part file closed and durable in the staging directory (uploaded there from
    this host's disk on HDFS and object stores); for partitioned output then the
    attempt's mark that all of them are (what the sink's ``probe`` reads: an
    unpartitioned attempt's one file says it). Returns the directories, sorted."""
    directories = sorted(part.writers)
    try:
        for directory in directories:
            part.writers[directory].close()
            staged = posixpath.join(part.directory, directory, part.file_name)
            if part.local_dir != part.directory:
                files.upload_new(os.path.join(part.local_dir, directory, part.file_name),
                                 staged)
            elif fsync:
                files.make_durable(staged)
                files.make_durable(posixpath.dirname(staged))
    finally:
        if part.local_dir != part.directory:
            shutil.rmtree(part.local_dir, ignore_errors=True)
    if partitioned:
        files.create_new(posixpath.join(part.directory, PREPARED_MARK), b"")
        if fsync:
            files.make_durable(part.directory)
    return directories
