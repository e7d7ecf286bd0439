"""Exactly-once appends (and upserts by key) to a Delta Lake table on a local path or
S3 (``stores.py``), written with delta-rs (``deltalake``), no JVM.

- **Phase 1** (a task): the attempt holds its rows until a file's worth
  (``core/rowbuffer.py``), then writes them as Parquet files into the table's directory
  (``col=value/`` directories for ``partition_by``), named after its transaction ID, and
  lists each one in its manifest before writing it (``files.py``). Nothing references
  them yet: readers do not see them.
- **Prepare**: the rows still held are written; the receipt names the files with what
  a Delta add action needs (size, partition values, rows).
- **Commit**: one Delta commit adds every file of the batch (the decision groups all
  participants under one committer: ``merges_commits``), with a ``SetTransaction`` of
  app ID ``sparkeos.<query key>.<sink>`` and version = batch, which makes it idempotent
  and safe beside a twin committer (``table.py``). The first commit creates the table.
- **Rollback / sweep**: an attempt that can never commit has its files and manifest
  deleted; a file the table references is never deleted.

Concurrent appenders to the same table are retried by the commit (Delta appends do not
conflict); the commit fails only with a clear error after many conflicts in a row.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from sparkeos.core.config import Guarantee
from sparkeos.core.errors import AttemptFencedError, ConfigurationError, DataLossError
from sparkeos.core.protocol import Receipt, Transaction, TransactionalSink, TxnState
from sparkeos.core.rowbuffer import RowBuffer
from sparkeos.core.snapshot.txpool import AttemptRange
from sparkeos.core.steps import commit_step
from sparkeos.core.storage.attempts import TableFiles
from sparkeos.core.upsertkeys import check_key, refuse_repeated_keys

from . import files, stores, table, upsert
from .files import DataFile


@dataclass
class DeltaHandle:
    txn: Transaction
    written: list[DataFile] = field(default_factory=list)
    schema: pa.Schema | None = None
    keys: set[tuple[object, ...]] = field(default_factory=set)
    """The upsert keys this attempt wrote (a repeat is refused)."""
    held: RowBuffer = field(default_factory=RowBuffer)
    """Rows not written yet: a file's worth, or what prepare writes."""


@dataclass(frozen=True)
class DeltaSink(TransactionalSink[DeltaHandle]):
    """Append a stream's rows to the Delta table at ``path`` (a local path, a ``file:``
    URI, an S3, Azure Blob Storage or HDFS URI: ``s3a://bucket/tables/orders``,
    ``abfss://container@account.dfs.core.windows.net/orders``,
    ``hdfs://namenode:8020/orders``), each batch once.
    ``partition_by``: the table's partition columns (strings, integers, booleans or
    dates)."""

    path: str
    partition_by: tuple[str, ...] = ()
    key: tuple[str, ...] = ()
    """Upsert by these columns (an update-mode aggregation): each batch MERGEs its rows
    into the table in phase 2, once, instead of appending."""

    guarantees: ClassVar[frozenset[Guarantee]] = frozenset(Guarantee)
    commit_steps: ClassVar[tuple[str, ...]] = ("version_read", "committed")

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ConfigurationError("DeltaSink needs the table's path",
                                     fix='DeltaSink("/data/tables/orders")')
        # Resolved here, on the driver, and pickled with the sink: the tasks and the
        # commit reach the same store at the same endpoint whatever their environment.
        object.__setattr__(self, "_where", stores.table_files(self.path))
        object.__setattr__(self, "partition_by", tuple(self.partition_by))
        object.__setattr__(self, "key", (self.key,) if isinstance(self.key, str)
                           else tuple(self.key))

    @property
    def where(self) -> TableFiles:
        where: TableFiles = self.__dict__["_where"]
        return where

    @property
    def root(self) -> str:
        """The table's location as delta-rs is given it (a local path made absolute)."""
        return self.where.uri()

    # -- driver --------------------------------------------------------------------------
    def cluster_by(self) -> tuple[str, ...]:
        return self.key  # a key's rows in one participant: a repeat is seen there

    def validate(self, schema: pa.Schema) -> None:
        check_key(self.key, schema)
        for column in self.partition_by:
            if column not in schema.names:
                raise ConfigurationError(
                    f"partition column {column!r} is not a column of the batch "
                    f"({', '.join(schema.names)})", fix="partition by a column the stream has")
            files.check_partition_column(column, schema.field(column).type)
        self.where.check_writes()  # delta-rs' log commits rest on it too
        recorded = table.table_schema(self.where)
        if recorded is not None and set(recorded.names) != set(schema.names):
            raise ConfigurationError(
                f"the Delta table at {self.path} has the columns {recorded.names}, the "
                f"batch {schema.names}", fix="select the table's columns, or write "
                "another table")
        partitioned = table.partition_columns(self.where)
        if partitioned is not None and partitioned != list(self.partition_by):
            raise ConfigurationError(
                f"the Delta table at {self.path} is partitioned by {partitioned}, the "
                f"sink by {list(self.partition_by)}",
                fix=f"DeltaSink(..., partition_by={tuple(partitioned)!r}), or another table")

    # -- phase 1 ---------------------------------------------------------------------------
    def begin(self, txn: Transaction) -> DeltaHandle:
        if not self.where.claim(txn.txn_id):
            raise _fenced(txn)
        return DeltaHandle(txn)

    def write(self, handle: DeltaHandle, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        batch = files.normalised(batch.replace_schema_metadata(None))
        handle.schema = batch.schema
        if self.key:
            refuse_repeated_keys(handle.keys, batch, self.key, handle.txn)
        if handle.held.add(pa.Table.from_batches([batch])):  # a file's worth: written now
            _write_held(self.where, handle, bool(self.key), self.partition_by)

    def prepare(self, handle: DeltaHandle) -> Receipt:
        _write_held(self.where, handle, bool(self.key), self.partition_by)
        receipt: Receipt = {"files": [f.as_json() for f in handle.written]}
        if handle.schema is not None and handle.written:
            # The table's schema when the batch creates it (its files lack the
            # partition columns): Arrow's own encoding, a few hundred bytes.
            receipt["schema"] = base64.b64encode(
                handle.schema.serialize().to_pybytes()).decode()
        return receipt

    # -- phase 2 -------------------------------------------------------------------------
    def merges_commits(self) -> bool:
        return True

    def commit_groups(self, receipts: Sequence[Receipt], committers: int) -> list[int]:
        return [0] * len(receipts)  # one table commit per batch

    def commit_merged(self, items: Sequence[tuple[Transaction, Receipt]], *,
                      recovering: bool) -> None:
        if not items:
            return
        first = items[0][0]
        written = [DataFile.from_json(f) for _, receipt in items for f in receipt["files"]]
        done = table.committed_version(self.where, first.query_key, first.sink)
        commit_step("version_read", first)
        if done is None or done < first.batch_id:
            self._commit_files(first, written, [r for _, r in items], idempotent=True)
        commit_step("committed", first)
        for txn, _ in items:
            self._forget(txn, written)

    def _commit_files(self, txn: Transaction, written: Sequence[DataFile],
                      receipts: Sequence[Receipt], idempotent: bool) -> None:
        if not written:
            return  # an empty batch: nothing to add or merge
        if not self._require_files(txn, written, idempotent):
            return  # a twin committed the batch and cleared its staged files
        schema = _table_or_batch_schema(self.where, receipts)
        if schema is None:
            return  # the batch wrote no file
        if idempotent:
            table.record_query(self.where, txn.query_key, txn.sink)
        if self.key:
            try:
                table.merge_batch(self.where, schema, self.partition_by, self.key,
                                  [f.path for f in written],
                                  txn.query_key, txn.sink, txn.batch_id,
                                  app_version=idempotent)
            except FileNotFoundError:
                # A twin (``sparkeos recover`` beside the driver) merged the batch and
                # deleted its staged rows after the check above: done, or lost.
                if self._require_files(txn, written, idempotent):
                    raise
        else:
            table.commit_batch(self.where, schema, self.partition_by, written,
                               txn.query_key, txn.sink, txn.batch_id, app_version=idempotent)

    def _forget(self, txn: Transaction, written: Sequence[DataFile]) -> None:
        """A committed attempt's bookkeeping: its manifest (and, for an upsert, its
        staged rows, which the MERGE copied)."""
        if self.key:
            self.where.delete([f.path for f in written
                               if f.path.startswith(upsert.staged_prefix(txn))])
        self.where.delete_manifest(txn.txn_id)

    def for_guarantee(self, guarantee: Guarantee) -> DeltaSink:
        """Under at-least-once (or none) each task commits its own files, with no
        app version: the batch's other tasks commit theirs too."""
        if guarantee is Guarantee.EXACTLY_ONCE:
            return self
        copy = dataclasses.replace(self)
        copy.__dict__["_per_task"] = True
        return copy

    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        if not self.__dict__.get("_per_task"):
            # Exactly-once: a batch of one participant is the merged commit of one.
            self.commit_merged([(txn, receipt)], recovering=False)
            return
        written = [DataFile.from_json(f) for f in receipt["files"]]
        self._commit_files(txn, written, [receipt], idempotent=False)
        self._forget(txn, written)

    def recover_commit(self, txn: Transaction, receipt: Receipt) -> None:
        if not self.__dict__.get("_per_task"):
            self.commit_merged([(txn, receipt)], recovering=True)
            return
        self.commit(txn, receipt)

    def rollback(self, txn: Transaction) -> None:
        self._roll_back(txn, None)

    def _roll_back(self, txn: Transaction, referenced: set[str] | None) -> set[str] | None:
        """Delete the attempt's files the table does not reference, then its manifest;
        the table's referenced files (read once, when there is something to delete)."""
        paths = self.where.read_manifest(txn.txn_id)
        if paths is None:
            return referenced
        if referenced is None:
            referenced = table.referenced(self.where)
        self.where.delete([p for p in paths if p not in referenced])
        self.where.delete_manifest(txn.txn_id)
        return referenced

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        # One listing of the manifests, not a read per ID of the ranges (a request each
        # on an object store): an attempt claims its manifest before it writes a file
        # and drops it last, so an ID without one left nothing.
        held = self.where.manifests()
        referenced: set[str] | None = None
        for attempt_range in ranges:
            for txn in attempt_range.transactions():
                if txn.txn_id not in held:
                    continue
                if txn.txn_id in keep:
                    self.where.delete_manifest(txn.txn_id)  # committed: files stay
                else:
                    referenced = self._roll_back(txn, referenced)

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        others = table.other_queries(self.where, query_key, sink)
        if not others:
            return None
        return (f"Delta commits of sink {sink!r} by query keys {', '.join(others)} in "
                f"{self.path}")

    def probe(self, txn: Transaction) -> TxnState:
        return (TxnState.PREPARED if self.where.read_manifest(txn.txn_id) is not None
                else TxnState.UNKNOWN)

    def identity(self) -> dict[str, Any]:
        return {"path": stores.table_identity(self.where)}

    # -- helpers ------------------------------------------------------------------------------
    def _require_files(self, txn: Transaction, written: Sequence[DataFile],
                       idempotent: bool) -> bool:
        """Whether the batch's files are all there; False when they are gone because a
        twin committed the batch meanwhile (an upsert's staged rows are deleted once
        merged); ``DataLossError`` when they are gone and the batch is not committed."""
        missing = [f.path for f in written if not self.where.exists(f.path)]
        if not missing:
            return True
        done = table.committed_version(self.where, txn.query_key, txn.sink)
        if idempotent and done is not None and done >= txn.batch_id:
            return False
        raise DataLossError(
            f"batch {txn.batch_id} is decided but its prepared files are gone from "
            f"{self.path}: {missing[:3]}", sink=txn.sink, batch_id=txn.batch_id,
            fix="restore the files from a backup of the table directory; something other "
            "than sparkeos deleted them (a VACUUM with retention 0?)")


def _table_or_batch_schema(where: TableFiles, receipts: Sequence[Receipt]) -> pa.Schema | None:
    """The table's schema, else the batch's (None: the batch wrote no file)."""
    recorded = table.table_schema(where)
    if recorded is not None:
        return recorded
    for receipt in receipts:
        if receipt.get("schema"):
            return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(receipt["schema"])))
    return None


def _write_held(where: TableFiles, handle: DeltaHandle, staged: bool,
                partition_by: Sequence[str]) -> None:
    """Write the rows the attempt holds: an upsert's ``staged`` whole, outside the table
    (phase 2 merges them); else a file per partition."""
    rows = handle.held.take()
    if rows is None:
        return
    if staged:
        _write_file(where, handle, upsert.staged_path(handle.txn, len(handle.written)),
                    rows, {})
        return
    for values, part in files.split_by_partition(rows, partition_by):
        directory = files.partition_dir(values)
        name = f"part-{len(handle.written):05d}-{handle.txn.txn_id}.parquet"
        _write_file(where, handle, f"{directory}/{name}" if directory else name, part,
                    values)


def _write_file(where: TableFiles, handle: DeltaHandle, relative: str, rows: pa.Table,
                values: dict[str, str | None]) -> None:
    """Listed in the manifest first: a rollback finds every file it may leave."""
    where.write_manifest(handle.txn.txn_id, [f.path for f in handle.written] + [relative])
    size = files.write_file(where, relative, rows)
    if size is None:  # a file of this attempt ID is in place: a zombie
        raise _fenced(handle.txn)
    handle.written.append(DataFile(relative, size, values, rows.num_rows))


def _fenced(txn: Transaction) -> AttemptFencedError:
    return AttemptFencedError(
        f"another attempt already wrote under transaction {txn.txn_id}", sink=txn.sink,
        batch_id=txn.batch_id,
        fix="nothing to do: Spark retries the task under its next attempt number")


__all__ = ["DeltaHandle", "DeltaSink"]
