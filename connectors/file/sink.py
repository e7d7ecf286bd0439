"""Exactly-once file sink: JSON Lines or Parquet part files in one directory, on a
local or shared POSIX path or on HDFS (``hdfs://``, ``webhdfs://``; ``core.storage.files``).

Phase 1: a task attempt writes its part file under a hidden staging directory of its
own, ``<path>/.sparkeos-staging/<attempt txn id>/``, and fsyncs it (prepare).
Phase 2: the driver links the staged file to its final, deterministic name
``<path>/part-<query>-<sink>-<batch>-<partition>-<content>.<ext>``, where ``<content>``
is the fingerprint of the rows it holds (``core.snapshot.fingerprint``). ``link`` is atomic and
never replaces an existing file, and a target that already exists holds these very rows
for this (batch, partition) (the commit was done before, or an earlier at-least-once run
committed the same partition), so commit is idempotent and readers never see partial or
duplicate files. A replay whose partition holds other rows (a restart partitioned
otherwise) gets another name: it never mistakes an earlier run's file for its own.
Rollback deletes one attempt's staging directory; the coordinator's sweep deletes
those of every attempt that can no longer be committed. Hidden names (leading ``.``)
are skipped by Spark, pandas and pyarrow readers.

Concurrent attempts (speculation, zombies) stage under distinct attempt IDs, and only
the attempt named by ``decided(N)`` is ever linked into place; files of any other
attempt stay hidden until a sweep removes them.

On HDFS a task writes its part file on its own local disk, then uploads it whole into
its staging directory at prepare (``CREATE`` that fails on an existing file), and the
commit is HDFS's ``rename``, which is atomic and never replaces an existing file: the
same guarantees as ``link``.

With ``partition_by`` the output is laid out as Spark's ``.partitionBy(...)`` lays it
out (``layout.py``): an attempt stages one part file per partition directory it has rows
for, ``<staging>/<attempt>/<col>=<value>/part-...``, and phase 2 moves each into
``<path>/<col>=<value>/`` under the same name, each move as above.

Phase 1's part files are written in ``staging.py`` (Parquet as Spark's own writer
writes it: ``parquet.py``), phase 2's move into place is in ``publish.py``, the
partitioned layout in ``layout.py``; this module holds the sink's protocol and the
readers of committed output.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkeos.core.config import task_property
from sparkeos.core.errors import ConfigurationError
from sparkeos.core.protocol import Receipt, Transaction, TransactionalSink, TxnState
from sparkeos.core.snapshot.txpool import AttemptRange, TransactionPool
from sparkeos.core.storage.files import Files
from sparkeos.core.storage.fsutil import (
    DriverMark,
    claim_dir,
    mark_driver_dir,
    require_shared,
    require_writable_dir,
)
from sparkeos.core.storage.registry import split_uri
from sparkeos.core.streaming.spark import SPARK_SCHEMA_KEY

from . import layout
from .parquet import (
    CODEC_EXTENSIONS,
    ParquetFiles,
    ParquetSettings,
    active_session_settings,
    spark_schema_of,
)
from .parquet import read_table as read_parquet
from .parquet_schema import parquet_schema
from .parquet_settings import SETTINGS
from .publish import publish
from .staging import (
    PREPARED_MARK,
    StagedPart,
    finish,
    open_writer,
    write_rows,
)

STAGING_DIR = ".sparkeos-staging"
FORMATS = {"jsonl": ".json", "parquet": ".parquet"}
"""Each format's file extension, as Spark's own writer of that kind names its files
(Spark's json writer writes JSON Lines under ``.json``; a downstream ``*.json`` glob
finds both). Parquet files also carry the codec, as Spark's do (``.snappy.parquet``)."""
_OLD_EXTENSIONS = (".jsonl",)
"""What earlier versions named JSON Lines part files: still read, probed and listed."""
_PART = re.compile(r"^part-([^-]+)-(.+)-(\d{10})-(\d{5})(?:-[0-9a-f]{16})?"
                   r"(?:\.[a-z0-9]+)?\.(?:parquet|json|jsonl)$")
CONTENT_DIGITS = 16
"""Hex digits of the rows' fingerprint in a part file's name."""


@dataclass(frozen=True)
class FileSink(TransactionalSink[StagedPart]):
    """Write each batch as part files into ``path``: a local or shared POSIX directory,
    or an HDFS URI (``hdfs://namenode:8020/out`` or ``webhdfs://namenode:9870/out``).

    ``format``: ``"parquet"`` (default) or ``"jsonl"``. Parquet files are written as
    Spark's own Parquet writer writes them (``parquet.py``), under the Spark settings
    that change them (``spark.sql.parquet.outputTimestampType``, ``writeLegacyFormat``,
    ``compression.codec``, ``fieldId.write.enabled``): those of the active Spark session
    where the sink is made, and ``spark_settings`` (by the same names) over them;
    Spark's defaults otherwise. ``compression``: the Parquet codec, over the session's
    (Spark's ``compression`` write option). ``partition_by``: columns to lay the output
    out by, as Spark's ``partitionBy`` does (``<path>/date=2026-11-26/part-...``;
    columns of every type Spark's ``partitionBy`` takes but floating point and intervals,
    named as Spark names them: ``core/text/sparktext.py``). ``fsync``: make staged files
    durable before prepare returns (disable only for benchmarks on throw-away data).
    """

    path: str
    format: str = "parquet"
    compression: str | None = None
    fsync: bool = True
    partition_by: Sequence[str] = ()
    spark_settings: Mapping[str, str] | None = None

    commit_steps = ("checked", "published")

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigurationError("FileSink needs a path", fix="FileSink(path='/data/out')")
        # Resolved here, on the driver, and pickled with the sink: tasks reach the same
        # file system whatever their environment (e.g. SPARKEOS_WEBHDFS_PORT).
        files, root = split_uri(self.path)
        object.__setattr__(self, "partition_by", layout.normalise_columns(self.partition_by))
        object.__setattr__(self, "_files", files)
        object.__setattr__(self, "_root", root)
        if self.format not in FORMATS:
            raise ConfigurationError(
                f"unknown file format {self.format!r}",
                fix=f"use one of: {', '.join(FORMATS)}",
            )
        if self.format == "parquet":
            given = dict(self.spark_settings or {})
            unknown = sorted(set(given) - set(SETTINGS))
            if unknown:
                raise ConfigurationError(
                    f"spark_settings of FileSink at {self.directory} names {unknown}, which "
                    "the Parquet files do not follow",
                    fix=f"give only these settings: {', '.join(SETTINGS)}")
            # The session's settings where the sink is made: the query's, on foreachBatch
            # (each task checks that its session agrees: ParquetSettings.check_session).
            settings = ParquetSettings.resolve({**active_session_settings(), **given},
                                               self.compression,
                                               f"output directory {self.directory}")
            object.__setattr__(self, "compression", settings.codec)
            self.__dict__["_parquet"] = settings

    @property
    def files(self) -> Files:
        files: Files = self.__dict__["_files"]
        return files

    @property
    def directory(self) -> str:
        """The output directory: a local path, or the full URI on HDFS."""
        return self.files.uri(self._root_path)

    @property
    def _driver_mark(self) -> DriverMark | None:
        mark: DriverMark | None = self.__dict__.get("_mark")
        return mark

    @property
    def _root_path(self) -> str:
        root: str = self.__dict__["_root"]
        return root

    @property
    def extension(self) -> str:
        """The part files' extension, as Spark's writer of the format names them."""
        if self.format == "parquet":
            return CODEC_EXTENSIONS[str(self.compression)] + FORMATS["parquet"]
        return FORMATS[self.format]

    @property
    def _parquet_files(self) -> ParquetFiles | None:
        """How the Parquet part files are written (None for JSON Lines): the settings, and
        the Spark schema ``validate`` was given (pickled to the tasks with the sink)."""
        settings: ParquetSettings | None = self.__dict__.get("_parquet")
        if settings is None:
            return None
        return ParquetFiles(settings, self.__dict__.get("_spark_schema"))

    def identity(self) -> dict[str, Any]:
        # A query's layout may not change under it: a replay laid out otherwise would not
        # find the files of its batch. (Only partitioned sinks name it: the identity of
        # an unpartitioned one stays what earlier versions recorded.)
        partitioned = {"partition_by": list(self.partition_by)} if self.partition_by else {}
        return {"path": self.directory, "format": self.format, **partitioned}

    # -- driver ------------------------------------------------------------------------
    def shared_paths(self) -> tuple[str, ...]:
        # HDFS is one namespace for every process; a POSIX path is shared only by a mount.
        return (self._staging_root(),) if self.files.is_local else ()

    def task_columns(self) -> tuple[str, ...]:
        # JSON Lines and the partition directories' names are made in the task
        # (core/text/sparkjson.py, core/text/sparktext.py: the format route has no JVM to ask), not
        # by Spark's to_json and CAST: that text crossing to Python costs more than
        # Arrow's kernels take to make it.
        return ()

    def validate(self, schema: pa.Schema) -> None:
        layout.check_columns(self.partition_by, schema, f"output directory {self.directory}")
        parquet = self.__dict__.get("_parquet")
        if parquet is not None:  # Spark's schema, for the tasks' files; refused types here
            spark = (schema.metadata or {}).get(SPARK_SCHEMA_KEY)
            self.__dict__["_spark_schema"] = spark.decode() if spark else None
            parquet_schema(spark_schema_of(schema, self.__dict__["_spark_schema"]),
                           parquet.timestamps, parquet.legacy, parquet.field_ids)
        staging = self._staging_root()
        require_writable_dir(
            staging, f"output directory {self.directory}",
            "create the directory and give the Spark user write access, or choose another "
            "path", self.files,
        )
        if self._driver_mark is None:  # once per query run; tasks get it with the sink
            self.__dict__["_mark"] = mark_driver_dir(staging, self.files)

    # -- phase 1 -------------------------------------------------------------------------
    def begin(self, txn: Transaction) -> StagedPart:
        files = self.files
        require_shared(self._staging_root(), f"output directory {self.directory}", txn,
                       self._driver_mark, files)
        parquet = self.__dict__.get("_parquet")
        if parquet is not None:  # Spark's own writer would follow the query's session
            parquet.check_session(task_property, f"output directory {self.directory}")
        directory = claim_dir(self._txn_dir(txn.txn_id), txn, files)
        # On HDFS the part file is written on this host first; its temporary directory
        # is made with the first row (an empty partition leaves nothing behind).
        return StagedPart(txn, directory, self._final_name(txn),
                       directory if files.is_local else "")

    def write(self, handle: StagedPart, batch: pa.RecordBatch) -> None:
        parts = (layout.split(batch, self.partition_by) if self.partition_by
                 else [("", batch)])
        for directory, rows in parts:
            writer = handle.writers.get(directory)
            if writer is None:
                writer = handle.writers[directory] = open_writer(
                    handle, rows.schema, self._parquet_files, directory)
            write_rows(writer, self.format, rows)
        handle.content.update(batch)
        handle.rows += batch.num_rows

    def prepare(self, handle: StagedPart) -> Receipt:
        if not handle.writers:
            return {"file": None, "rows": 0}
        directories = finish(handle, self.files, self.fsync, bool(self.partition_by))
        written = handle.content.written()
        receipt: Receipt = {
            "file": handle.file_name, "rows": handle.rows, "host": socket.gethostname(),
            "final": self._published_name(handle.txn, written.fingerprint),
            "written": written.as_json()}
        if self.partition_by:
            receipt["dirs"] = directories
        return receipt

    def abort(self, handle: StagedPart, txn: Transaction) -> None:
        for writer in handle.writers.values():
            try:
                writer.close()
            except Exception:
                pass
        if handle.local_dir and handle.local_dir != handle.directory:
            shutil.rmtree(handle.local_dir, ignore_errors=True)
        self.files.delete(handle.directory)

    # -- phase 2 / recovery -------------------------------------------------------------------
    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        publish(self.files, txn, receipt, self._txn_dir(txn.txn_id), self._root_path,
                self.fsync)

    def rollback(self, txn: Transaction) -> None:
        self.files.delete(self._txn_dir(txn.txn_id))

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        """One listing of the staging directory instead of one call per possible ID."""
        for name in staged_attempts(self.path, ranges):
            if name not in keep:
                self.files.delete(self._txn_dir(name))

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        others: dict[str, int] = {}
        for file in committed_files(self.path, self.format):
            match = _PART.match(os.path.basename(file))
            if match and match.group(2) == sink and match.group(1) != query_key:
                others[match.group(1)] = max(others.get(match.group(1), -1),
                                             int(match.group(3)))
        if not others:
            return None
        return "part files of query keys " + ", ".join(
            f"{key} (batches up to {last})" for key, last in sorted(others.items()))

    def probe(self, txn: Transaction) -> TxnState:
        files, directory = self.files, self._txn_dir(txn.txn_id)
        prepared = (posixpath.join(directory, PREPARED_MARK) if self.partition_by
                    else posixpath.join(directory, self._final_name(txn)))
        if files.exists(prepared):
            return TxnState.PREPARED
        if files.isdir(directory):
            return TxnState.OPEN
        stem = self._final_name(txn)[:-len(self.extension)]
        if any(posixpath.basename(name).startswith(stem)
               for name in committed_files(self.path, self.format)):
            return TxnState.COMMITTED
        return TxnState.ABSENT

    # -- helpers ---------------------------------------------------------------------------------
    def _staging_root(self) -> str:
        return posixpath.join(self._root_path, STAGING_DIR)

    def _txn_dir(self, txn_id: str) -> str:
        return posixpath.join(self._staging_root(), txn_id)

    def _final_name(self, txn: Transaction) -> str:
        """The name the attempt stages its part file under."""
        # The sink name keeps two sinks of one query apart in a shared directory.
        return (f"part-{txn.query_key}-{txn.sink}-{txn.batch_id:010d}-{txn.partition:05d}"
                f"{self.extension}")

    def _published_name(self, txn: Transaction, fingerprint: str) -> str:
        """The committed part file's name: it names the rows it holds, so a replay of
        (batch, partition) with other rows never takes an earlier run's file for its
        own (and one with the same rows finds it and writes nothing)."""
        stem = self._final_name(txn)[:-len(self.extension)]
        return f"{stem}-{fingerprint[:CONTENT_DIGITS]}{self.extension}"



def staged_attempts(path: str, ranges: Sequence[AttemptRange]) -> list[str]:
    """The attempt IDs staged under ``path`` that ``ranges`` cover."""
    if not ranges:
        return []
    files, root = split_uri(path)
    pool = TransactionPool(ranges[0].query_key, ranges[0].sink)
    found = []
    for name in files.listdir(posixpath.join(root, STAGING_DIR)):
        txn = pool.parse(name)
        if txn is not None and any(r.covers(txn) for r in ranges):
            found.append(name)
    return sorted(found)


def committed_files(path: str, format: str = "parquet") -> list[str]:
    """The committed part files of a FileSink directory, in its partition directories
    too (staging is never included): local paths, or full URIs on HDFS."""
    files, root = split_uri(path)
    extensions = (FORMATS[format],) + (_OLD_EXTENSIONS if format == "jsonl" else ())
    return sorted(files.uri(posixpath.join(root, name))
                  for name in _part_names(files, root, "", extensions))


def _part_names(files: Files, root: str, inside: str,
                extensions: tuple[str, ...]) -> list[str]:
    """Part files below ``root/inside``, as paths relative to ``root``."""
    found = []
    for name in files.listdir(posixpath.join(root, inside) if inside else root):
        relative = posixpath.join(inside, name) if inside else name
        if name.startswith("part-") and name.endswith(extensions):
            found.append(relative)
        elif layout.is_partition_dir(name):
            found += _part_names(files, root, relative, extensions)
    return found


def read_output(path: str, format: str = "parquet") -> pa.Table:
    """Read every committed row of a FileSink directory into one Arrow table; the
    partition columns of partitioned output come last, as strings (None for Spark's
    default partition), as in the directory names."""
    files, root = split_uri(path)
    tables = []
    for file in committed_files(path, format):
        inside = split_uri(file)[1]
        source = pa.BufferReader(files.read(inside)) if not files.is_local else file
        if format == "parquet":
            table = read_parquet(source)
        else:
            import pyarrow.json as pj

            table = pj.read_json(source)
        relative = posixpath.relpath(posixpath.dirname(inside), root)
        if relative != ".":
            for name, value in layout.partition_values(relative):
                table = table.append_column(
                    name, pa.repeat(pa.scalar(value, pa.string()), table.num_rows))
        tables.append(table)
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")
