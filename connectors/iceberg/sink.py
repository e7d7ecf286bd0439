"""Exactly-once appends to an Apache Iceberg table (issue 51; second part: the
foreachBatch and format routes, pyiceberg's SQL catalog, local paths and S3), written with
pyiceberg, no JVM.

- **validate** (driver, before each batch): the table is made from the batch's schema
  if the catalog has none; a table the sink cannot write yet is refused (``catalog.py``).
- **Phase 1** (a task): the attempt holds its rows until a file's worth
  (``core/rowbuffer.py``), then writes them as Parquet files, with the table's field
  IDs, a file per partition of the table's spec (``partitioning.py``), where the table
  keeps its data files, named after its transaction ID, and lists each one in its
  manifest before writing it (``files.py``). No snapshot references them yet: readers
  do not see them.
- **Prepare**: the rows still held are written; the receipt names the files (size,
  rows, partition record and spec).
- **Commit**: one fast append adds every file of the batch (the decision groups all
  participants under one committer: ``merges_commits``), and sets the table property
  ``sparkeos.batch.<query key>.<sink>`` to the batch in the same metadata commit, which
  makes it idempotent and safe beside a twin committer (``table.py``).
- **Rollback / sweep**: an attempt that can never commit has its files and manifest
  deleted; a file any snapshot in the table's metadata references is never deleted.
"""

from __future__ import annotations

import dataclasses
import errno
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from sparkeos.core.config import Guarantee
from sparkeos.core.errors import (
    AttemptFencedError,
    ConfigurationError,
    DataLossError,
    DataRejectedError,
    SchemaMismatchError,
)
from sparkeos.core.protocol import Receipt, Transaction, TransactionalSink, TxnState
from sparkeos.core.rowbuffer import RowBuffer
from sparkeos.core.snapshot.txpool import AttemptRange
from sparkeos.core.steps import commit_step
from sparkeos.core.upsertkeys import check_key, refuse_repeated_keys

from . import catalog, evolution, files, partitioning, respec, stores, table, upsert
from .files import DataFile


@dataclass
class IcebergHandle:
    txn: Transaction
    root: str
    """The table's location (``files.table_location``): where the manifest is."""
    target: pa.Schema
    """The table's schema in Arrow with its field IDs: what each file is written in."""
    data_location: Any
    """The table's location provider: where a data file of a given name goes."""
    parquet_options: dict[str, Any]
    """How the table's Parquet files are written (its codec)."""
    spec: Any
    """The table's partition spec when the attempt began (pyiceberg's ``PartitionSpec``)."""
    schema: Any
    """The table's Iceberg schema, which the spec's source IDs name."""
    written: list[DataFile] = field(default_factory=list)
    keys: set[tuple[object, ...]] = field(default_factory=set)
    """The upsert keys this attempt wrote (a repeat is refused)."""
    held: RowBuffer = field(default_factory=RowBuffer)
    """Rows not written yet: a file's worth, or what prepare writes."""


@dataclass(frozen=True)
class IcebergSink(TransactionalSink[IcebergHandle]):
    """Append a stream's rows to the Iceberg table ``table`` (``namespace.name``) of the
    catalog with the pyiceberg properties ``catalog`` (a SQL catalog, tables on local
    paths, S3, Google Cloud Storage or Azure Blob Storage), each batch once.
    ``catalog_name``: the catalog's name, which a SQL catalog records with each table
    (Spark's Iceberg catalog of the same name and database sees the same tables)."""

    table: str
    catalog: Mapping[str, str] = field(default_factory=dict)
    catalog_name: str = "default"
    key: tuple[str, ...] = ()
    """Upsert by these columns (an update-mode aggregation): each batch replaces the
    table's rows with its keys in phase 2, once, instead of appending."""
    merge_schema: bool = False
    """Add the batch's new columns to the table, and write its missing optional ones as
    null (Spark's ``mergeSchema``); else the batch's columns must be the table's."""
    partition_by: tuple[str, ...] = ()
    """A table the sink makes is partitioned so (Spark SQL's spellings: ``"region"``,
    ``"days(at)"``, ``"bucket(16, id)"``); an existing one must be. Empty: its own spec."""

    guarantees: ClassVar[frozenset[Guarantee]] = frozenset(Guarantee)
    commit_steps: ClassVar[tuple[str, ...]] = ("batch_read", "committed")

    def __post_init__(self) -> None:
        catalog.checked_identifier(self.table)
        object.__setattr__(self, "catalog", catalog.checked_catalog(self.catalog))
        if not isinstance(self.catalog_name, str) or not self.catalog_name:
            raise ConfigurationError("IcebergSink needs a catalog name",
                                     fix='IcebergSink(..., catalog_name="default")')
        object.__setattr__(self, "key", (self.key,) if isinstance(self.key, str)
                           else tuple(self.key))
        object.__setattr__(self, "partition_by", (self.partition_by,) if isinstance(
            self.partition_by, str) else tuple(self.partition_by))
        self.__dict__["_partition"] = partitioning.parse(self.partition_by)
        # Resolved here, on the driver, and pickled with the sink (as the Delta and file
        # sinks' stores): every process's pyiceberg reaches the same endpoint.
        store = stores.warehouse_store(self.catalog)
        self.__dict__["_io"] = stores.io_properties(self.catalog, store)
        self.__dict__["_store"] = files.TableStore(store)

    @property
    def store(self) -> files.TableStore:
        store: files.TableStore = self.__dict__["_store"]
        return store

    def _catalog(self) -> Any:
        return catalog.open_catalog(self.catalog_name, {
            **self.catalog, **self.__dict__["_io"],
            **stores.io_credentials(self.catalog, self.store.warehouse)})

    def _load(self) -> Any:
        return catalog.load_table(self._catalog(), self.table)

    def _root(self) -> str | None:
        return catalog.table_root(self._catalog(), self.table)

    # -- driver --------------------------------------------------------------------------
    def shared_paths(self) -> tuple[str, ...]:
        # Tasks write into the warehouse and read the SQLite catalog the driver commits.
        return catalog.local_directories(self.catalog)

    def cluster_by(self) -> tuple[str, ...]:
        return self.key  # a key's rows in one participant: a repeat is seen there

    def validate(self, schema: pa.Schema) -> None:
        table.check_retry_hook()
        check_key(self.key, schema)
        wanted = self.__dict__["_partition"]
        partitioning.check_sources(wanted, schema)
        found = self._load() or catalog.create_table(self._catalog(), self.table, schema,
                                                     wanted)
        if self.merge_schema:
            found = evolution.merged(self._load, self.table, schema)
        catalog.check_table(found, self.table, schema, wanted, self.merge_schema)
        if self.key:
            partitioning.check_mergeable(found, self.table)
        stores.check_table_location(self.store.warehouse, str(found.location()),
                                    f"the location of {self.table}")
        self.store.table_files(files.table_location(str(found.location()))).check_writes()

    # -- phase 1 ---------------------------------------------------------------------------
    def begin(self, txn: Transaction) -> IcebergHandle:
        found = self._load()
        if found is None:
            raise ConfigurationError(
                f"the Iceberg table {self.table} is gone (the driver made it before the "
                "batch)", sink=txn.sink, batch_id=txn.batch_id,
                fix="restart the query: the next batch makes it again")
        root = files.table_location(str(found.location()))
        if not self.store.claim(root, txn.txn_id):
            raise _fenced(txn)
        return IcebergHandle(txn, root, catalog.arrow_schema(found), found.location_provider(),
                             catalog.parquet_options(found), found.spec(), found.schema())

    def write(self, handle: IcebergHandle, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        rows = _in_table_types(files.normalised(batch), handle.target, handle.txn)
        if self.key:
            refuse_repeated_keys(handle.keys, rows, self.key, handle.txn)
        if handle.held.add(rows):  # a file's worth: written now, the rest at prepare
            _write_held(self.store, handle, bool(self.key))

    def prepare(self, handle: IcebergHandle) -> Receipt:
        _write_held(self.store, handle, bool(self.key))
        return {"files": [f.as_json() for f in handle.written]}

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
        found = self._load()
        done = found is not None and table.holds(found, first.query_key, first.sink,
                                                 first.batch_id)
        commit_step("batch_read", first)
        if not done:
            self._commit_files(first, written, exactly_once=True, loaded=found)
        commit_step("committed", first)
        for txn, _ in items:
            self._forget(txn)

    def _commit_files(self, txn: Transaction, written: Sequence[DataFile],
                      exactly_once: bool, loaded: Any = None) -> None:
        """Commit ``written``; ``loaded``: the table as just loaded, the commit's first
        base (its metadata is not read twice)."""
        if not written:
            return  # an empty batch: nothing to add
        if not _require_files(self, txn, written, exactly_once):
            return  # a twin committed the batch meanwhile
        pending = [loaded] if loaded is not None else []

        def load() -> Any:
            return pending.pop() if pending else self._require_table()

        uris = [f.uri for f in written]
        if self.key:
            try:
                rows = upsert.staged_rows(self.store, uris)
            except FileNotFoundError:
                # A twin (``sparkeos recover`` beside the driver) merged the batch and
                # deleted its staged rows after the check above: done, or lost.
                if _require_files(self, txn, written, exactly_once):
                    raise
                return
            table.merge_batch(load, rows, self.key, txn.query_key, txn.sink, txn.batch_id,
                              exactly_once=exactly_once)
        else:
            _append(self.store, load, txn, written, exactly_once)

    def _require_table(self) -> Any:
        found = self._load()
        if found is None:
            raise DataLossError(f"the Iceberg table {self.table} is gone from its catalog "
                                "while a decided batch commits",
                                fix="restore the table (its catalog entry and metadata)")
        return found

    def _forget(self, txn: Transaction) -> None:
        """A committed attempt's bookkeeping: its manifest (its files stay; an upsert's
        staged rows, which the merge copied, go)."""
        root = self._root()
        if root is None:
            return
        if self.key:
            upsert.delete_staged(self.store, root, txn,
                                 self.store.read_manifest(root, txn.txn_id) or [])
        self.store.delete_manifest(root, txn.txn_id)

    def for_guarantee(self, guarantee: Guarantee) -> IcebergSink:
        """Under at-least-once (or none) each task commits its own files, without the
        batch property: the batch's other tasks commit theirs too."""
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
        self._commit_files(txn, [DataFile.from_json(f) for f in receipt["files"]],
                           exactly_once=False)
        self._forget(txn)

    def recover_commit(self, txn: Transaction, receipt: Receipt) -> None:
        if not self.__dict__.get("_per_task"):
            self.commit_merged([(txn, receipt)], recovering=True)
            return
        self.commit(txn, receipt)

    def rollback(self, txn: Transaction) -> None:
        root = self._root()
        uris = None if root is None else self.store.read_manifest(root, txn.txn_id)
        if root is None or uris is None:
            return
        staged = upsert.delete_staged(self.store, root, txn, uris) if self.key else set()
        present = [uri for uri in uris if uri not in staged and self.store.exists(uri)]
        found = self._load() if present else None
        keep = table.referenced(found, present) if found is not None else set()
        self.store.delete_files([uri for uri in uris if uri not in staged and uri not in keep])
        self.store.delete_manifest(root, txn.txn_id)

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        root = self._root()
        held = self.store.manifests(root) if root is not None else set()
        if not held:
            return  # one listing: nothing of any attempt is left
        for attempt_range in ranges:
            for txn in attempt_range.transactions():
                if txn.txn_id not in held:
                    continue
                if txn.txn_id in keep:
                    self._forget(txn)  # committed: its files stay
                else:
                    self.rollback(txn)

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        found = self._load()
        others = table.other_queries(found, query_key, sink) if found is not None else []
        if not others:
            return None
        return (f"Iceberg commits of sink {sink!r} by query keys {', '.join(others)} in "
                f"the table {self.table}")

    def probe(self, txn: Transaction) -> TxnState:
        root = self._root()
        return (TxnState.PREPARED if root is not None
                and self.store.read_manifest(root, txn.txn_id) is not None
                else TxnState.UNKNOWN)

    def identity(self) -> dict[str, Any]:
        return {"catalog": self.catalog_name,
                "uri": catalog.shown_uri(self.catalog.get("uri", "")), "table": self.table}

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        described["catalog"] = catalog.shown_properties(self.catalog)
        return described


def _append(store: files.TableStore, load: Any, txn: Transaction,
            written: Sequence[DataFile], exactly_once: bool) -> None:
    """Commit the batch's files, those written for another partition spec than the
    table's rewritten into it (``respec``; the originals deleted once it landed)."""
    replaced: list[str] = []
    try:
        landed = table.commit_batch(
            load, written, txn.query_key, txn.sink, txn.batch_id, exactly_once=exactly_once,
            in_spec=lambda found, files: respec.in_spec(store, found, files, replaced))
    except FileNotFoundError:
        # A twin landed the batch and deleted the files it rewrote after our check.
        found = load()
        if exactly_once and table.holds(found, txn.query_key, txn.sink, txn.batch_id):
            return
        raise
    if landed and replaced:
        respec.delete_replaced(store, load, replaced, txn)


def _write_held(store: files.TableStore, handle: IcebergHandle, staged: bool) -> None:
    """Write the rows the attempt holds: an upsert's ``staged`` whole, outside the
    table's data (phase 2 merges them); else a file per partition of the table's spec."""
    rows = handle.held.take()
    if rows is None:
        return
    if staged:
        parts = [partitioning.Part(None, rows)]
        uris = [upsert.staged_uri(handle.root, handle.txn, len(handle.written))]
    else:
        parts = partitioning.split(rows, handle.spec, handle.schema)
        uris = [str(handle.data_location.new_data_location(
            f"sparkeos-{handle.txn.txn_id}-{len(handle.written) + n:05d}.parquet",
            part.key)) for n, part in enumerate(parts)]
    _write_files(store, handle, parts, uris)


def _write_files(store: files.TableStore, handle: IcebergHandle,
                 parts: Sequence[partitioning.Part], uris: Sequence[str]) -> None:
    """Write each part's rows at its URI, every URI listed in the attempt's manifest
    first (a rollback finds every file it may leave)."""
    store.write_manifest(handle.root, handle.txn.txn_id,
                         [f.uri for f in handle.written] + list(uris))
    for part, uri in zip(parts, uris, strict=True):
        try:
            size = store.write_file(uri, part.rows, handle.parquet_options)
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise
            raise DataRejectedError(
                f"a partition's directory name is too long for the file system: {uri}",
                sink=handle.txn.sink, batch_id=handle.txn.batch_id,
                fix="partition the table by truncate(W, column) or bucket(N, column) "
                "instead of the column's whole value") from None
        if size is None:  # a file of this attempt ID is in place: a zombie
            raise _fenced(handle.txn)
        handle.written.append(DataFile(uri, size, part.rows.num_rows,
                                       tuple(partitioning.encode(part.key)),
                                       handle.spec.spec_id,
                                       partitioning.fingerprint(handle.spec)))


def _require_files(sink: IcebergSink, txn: Transaction, written: Sequence[DataFile],
                   exactly_once: bool) -> bool:
    """Whether the batch's files are all there; False when they are gone because a twin
    committed the batch meanwhile (an upsert's staged rows are deleted once merged);
    ``DataLossError`` when they are gone and the batch is not committed."""
    missing = [f.uri for f in written if not sink.store.exists(f.uri)]
    if not missing:
        return True
    found = sink._load()
    if exactly_once and found is not None and table.holds(
            found, txn.query_key, txn.sink, txn.batch_id):
        return False
    raise DataLossError(
        f"batch {txn.batch_id} is decided but its prepared files are gone from the "
        f"Iceberg table {sink.table}: {missing[:3]}", sink=txn.sink,
        batch_id=txn.batch_id, fix="restore the files from a backup of the table's "
        "data directory; something other than sparkeos deleted them (an orphan-file "
        "removal with a short age limit?)")


def _in_table_types(batch: pa.RecordBatch, target: pa.Schema,
                    txn: Transaction) -> pa.Table:
    """The rows in the table's column order and types, with its field IDs."""
    rows = pa.Table.from_batches([batch.replace_schema_metadata(None)])
    try:  # a column the batch lacks is null (mergeSchema; refused up front otherwise)
        return evolution.with_missing_as_null(rows, target).select(target.names).cast(target)
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaMismatchError(
            f"the batch's columns {batch.schema} do not fit the Iceberg table's "
            f"{target.remove_metadata()}: {exc}", sink=txn.sink, batch_id=txn.batch_id,
            fix="cast the columns to the table's types before the sink") from None


def _fenced(txn: Transaction) -> AttemptFencedError:
    return AttemptFencedError(
        f"another attempt already wrote under transaction {txn.txn_id}", sink=txn.sink,
        batch_id=txn.batch_id,
        fix="nothing to do: Spark retries the task under its next attempt number")


__all__ = ["IcebergHandle", "IcebergSink"]
