"""Exactly-once file sink: JSON Lines or Parquet part files in one directory.

Phase 1: a task writes its part file under a hidden staging directory
``<path>/.sparkeos-staging/<txn id>/<attempt>/`` and fsyncs it (prepare).
Phase 2: the driver renames the staged file to its final, deterministic name
``<path>/part-<query>-<batch>-<partition>.<ext>``. A rename is atomic, and a target
that already exists means the commit was done before, so commit is idempotent and
readers never see partial or duplicate files. Rollback deletes the staging directory
of a transaction ID. Hidden names (leading ``.``) are skipped by Spark, pandas and
pyarrow readers.

Fencing: each task attempt stages under its own attempt directory, and only the
attempt whose receipt reached ``decided(N)`` is ever renamed into place; files of a
zombie attempt stay hidden until the next rollback of that transaction ID removes them.
"""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import ConfigurationError, DataLossError
from sparkeos.core.fsutil import fsync_path, require_writable_dir
from sparkeos.core.protocol import Receipt, Transaction, TransactionalSink, TxnState

STAGING_DIR = ".sparkeos-staging"
FORMATS = {"jsonl": ".jsonl", "parquet": ".parquet"}


@dataclass
class _Staged:
    txn: Transaction
    directory: str
    file_name: str
    writer: Any = None
    rows: int = 0


@dataclass(frozen=True)
class FileSink(TransactionalSink[_Staged]):
    """Write each batch as part files into ``path`` (a local or shared POSIX directory).

    ``format``: ``"parquet"`` (default) or ``"jsonl"``. ``compression``: Parquet codec.
    ``fsync``: make staged files durable before prepare returns (disable only for
    benchmarks on throw-away data).
    """

    path: str
    format: str = "parquet"
    compression: str = "snappy"
    fsync: bool = True

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigurationError("FileSink needs a path", fix="FileSink(path='/data/out')")
        if "://" in self.path and not self.path.startswith("file://"):
            raise ConfigurationError(
                f"FileSink writes to POSIX paths; {self.path!r} is a URI",
                fix="mount the storage locally, or use a sink for that system",
            )
        if self.format not in FORMATS:
            raise ConfigurationError(
                f"unknown file format {self.format!r}",
                fix=f"use one of: {', '.join(FORMATS)}",
            )

    @property
    def directory(self) -> str:
        return os.path.abspath(self.path.removeprefix("file://"))

    def identity(self) -> dict[str, Any]:
        return {"path": self.directory, "format": self.format}

    # -- driver ------------------------------------------------------------------------
    def validate(self, schema: pa.Schema) -> None:
        require_writable_dir(
            os.path.join(self.directory, STAGING_DIR),
            f"output directory {self.directory}",
            "create the directory and give the Spark user write access, or choose another "
            "path",
        )

    # -- phase 1 -------------------------------------------------------------------------
    def begin(self, txn: Transaction) -> _Staged:
        attempt = txn.attempt or "driver"
        directory = os.path.join(self._txn_dir(txn.txn_id), f"b{txn.batch_id}-{attempt}")
        os.makedirs(directory, exist_ok=True)
        return _Staged(txn, directory, self._final_name(txn))

    def write(self, handle: _Staged, batch: pa.RecordBatch) -> None:
        if handle.writer is None:
            handle.writer = self._open_writer(handle, batch.schema)
        if self.format == "parquet":
            handle.writer.write_batch(batch)
        else:
            handle.writer.write(_jsonl(batch))
        handle.rows += batch.num_rows

    def prepare(self, handle: _Staged) -> Receipt:
        if handle.writer is None:
            return {"dir": os.path.basename(handle.directory), "file": None, "rows": 0}
        handle.writer.close()
        staged = os.path.join(handle.directory, handle.file_name)
        if self.fsync:
            fsync_path(staged)
            fsync_path(handle.directory)
        return {"dir": os.path.basename(handle.directory), "file": handle.file_name,
                "rows": handle.rows}

    def abort(self, handle: _Staged, txn: Transaction) -> None:
        if handle.writer is not None:
            try:
                handle.writer.close()
            except Exception:
                pass
        shutil.rmtree(handle.directory, ignore_errors=True)

    # -- phase 2 / recovery -------------------------------------------------------------------
    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        name = receipt.get("file")
        if name:
            staged = os.path.join(self._txn_dir(txn.txn_id), str(receipt["dir"]), name)
            final = os.path.join(self.directory, name)
            if not os.path.exists(final):
                try:
                    # rename() replaces silently, link() does not: a zombie can never
                    # overwrite a committed file.
                    os.link(staged, final)
                except FileExistsError:
                    pass
                except FileNotFoundError:
                    raise DataLossError(
                        f"staged file {staged} of a decided transaction is gone and {final} "
                        "does not exist",
                        sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
                        fix="something deleted the hidden staging directory; restore it from "
                        "a backup, or re-process this batch from the source",
                    ) from None
                if self.fsync:
                    fsync_path(self.directory)
        shutil.rmtree(self._txn_dir(txn.txn_id), ignore_errors=True)

    def rollback(self, txn: Transaction) -> None:
        shutil.rmtree(self._txn_dir(txn.txn_id), ignore_errors=True)

    def probe(self, txn: Transaction) -> TxnState:
        directory = self._txn_dir(txn.txn_id)
        if os.path.exists(os.path.join(self.directory, self._final_name(txn))):
            return TxnState.COMMITTED
        if os.path.isdir(directory) and os.listdir(directory):
            return TxnState.PREPARED
        return TxnState.ABSENT

    # -- helpers ---------------------------------------------------------------------------------
    def _txn_dir(self, txn_id: str) -> str:
        return os.path.join(self.directory, STAGING_DIR, txn_id)

    def _final_name(self, txn: Transaction) -> str:
        return (f"part-{txn.query_key}-{txn.batch_id:010d}-{txn.partition:05d}"
                f"{FORMATS[self.format]}")

    def _open_writer(self, handle: _Staged, schema: pa.Schema) -> Any:
        target = os.path.join(handle.directory, handle.file_name)
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetWriter(target, schema, compression=self.compression)
        return open(target, "wb")


def _jsonl(batch: pa.RecordBatch) -> bytes:
    frame = _iso_timestamps(batch).to_pandas()
    buffer = io.StringIO()
    frame.to_json(buffer, orient="records", lines=True, date_format="iso", date_unit="us")
    text = buffer.getvalue()
    if text and not text.endswith("\n"):
        text += "\n"
    return text.encode()


def _iso_timestamps(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Top-level timestamp columns as ISO-8601 text, formatted by numpy.

    The text is what pandas' ``to_json(date_format="iso", date_unit="us")`` writes
    (``2026-01-02T03:04:05.000000``, in UTC with a ``Z`` suffix for zoned timestamps),
    but pandas formats zoned timestamps one Python object at a time (~10x slower: most
    of the JSON Lines write time) and segfaults on years before 1000. ``ns`` columns are
    left to pandas (Spark sends ``us``).
    """
    columns = list(batch.columns)
    changed = False
    for i, field in enumerate(batch.schema):
        if pa.types.is_timestamp(field.type) and field.type.unit != "ns":
            columns[i] = _iso_text(columns[i])
            changed = True
    if not changed:
        return batch
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def _iso_text(column: pa.Array) -> pa.Array:
    import numpy as np
    import pyarrow.compute as pc

    kind = column.type
    # The stored values are UTC (zoned) or wall-clock (naive) counts since the epoch.
    micros = pc.fill_null(column.cast(pa.timestamp("us", tz=kind.tz)).cast(pa.int64()), 0)
    text = np.datetime_as_string(micros.to_numpy().view("datetime64[us]"), unit="us")
    if kind.tz is not None:
        text = np.char.add(text, "Z")
    mask = column.is_null().to_numpy(zero_copy_only=False) if column.null_count else None
    return pa.array(text, pa.string(), mask=mask)


def committed_files(path: str, format: str = "parquet") -> list[str]:
    """The committed part files of a FileSink directory (staging is never included)."""
    directory = os.path.abspath(path.removeprefix("file://"))
    if not os.path.isdir(directory):
        return []
    ext = FORMATS[format]
    return sorted(
        os.path.join(directory, name)
        for name in os.listdir(directory)
        if name.startswith("part-") and name.endswith(ext)
    )


def read_output(path: str, format: str = "parquet") -> pa.Table:
    """Read every committed row of a FileSink directory into one Arrow table."""
    tables = []
    for file in committed_files(path, format):
        if format == "parquet":
            import pyarrow.parquet as pq

            tables.append(pq.read_table(file))
        else:
            import pyarrow.json as pj

            tables.append(pj.read_json(file))
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")
