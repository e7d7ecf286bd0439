"""The Iceberg table's commits, through pyiceberg: one fast append per batch adds every
file of the batch, and in the same metadata commit sets the table property
``sparkeos.batch.<query key>.<sink>`` to the batch. That property is how a commit finds
its batch already committed, in O(1) (no walk through the snapshots' history) and after
snapshot expiry (properties are not snapshots). The snapshot's summary carries
``sparkeos.app`` (``<query key>.<sink>``), ``sparkeos.query``, ``sparkeos.sink`` and
``sparkeos.batch`` for people and for the lost-checkpoint check.

Every catalog commit is a compare-and-swap of the table's metadata pointer, so two
committers of one batch at once cannot both land: the loser sees ``CommitFailedException``
and reads the property again. pyiceberg 0.12 retries a failed commit by itself, rebuilding
the snapshot on the new metadata without asking whether that metadata already holds the
batch; ``_BatchTransaction`` asks first, and stops the retry when a twin committed it.
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sparkeos.core.errors import ConfigurationError, RetriableError, SchemaMismatchError
from sparkeos.core.observe import log_event

from . import partitioning
from .files import DataFile

COMMIT_ATTEMPTS = 20
"""Commits retried after a conflict (another writer committed first) before giving up;
pyiceberg retries each of them a few times more (``commit.retry.num-retries``)."""
BATCH_PREFIX = "sparkeos.batch."
WRITTEN_PREFIX = "sparkeos.written."
"""At least once: the last batch whose tasks committed (no promise of the whole batch)."""


def batch_property(query_key: str, sink: str) -> str:
    return f"{BATCH_PREFIX}{query_key}.{sink}"


def committed_batch(properties: dict[str, str], query_key: str, sink: str) -> int | None:
    """The last batch the table holds for this (query, sink); None if none."""
    value = properties.get(batch_property(query_key, sink))
    return None if value is None else int(value)


def holds(table: Any, query_key: str, sink: str, batch: int) -> bool:
    done = committed_batch(table.properties, query_key, sink)
    return done is not None and done >= batch


def _data_files(table: Any, written: Sequence[DataFile], batch: int) -> list[Any]:
    """The batch's files as the table's data files, read against its schema and
    partition spec now (``written``: all in that spec; the sink rewrites those of
    another first): a column another writer dropped since phase 1 is refused
    with the fix (the batch stays decided; every retry would meet the same table)."""
    name = ".".join(table.name())
    spec = table.spec()
    other = [f.uri for f in written
             if not partitioning.written_for(f.spec_id, f.spec_fields, spec)]
    if other:
        raise SchemaMismatchError(
            f"batch {batch}'s files {other[:3]} were written for another partition spec "
            f"than the Iceberg table {name}'s now ({spec})",
            fix="restart the query or run `sparkeos recover`: the commit rewrites them "
            "into the table's spec")
    try:
        return [_data_file(table, f, spec) for f in written]
    except KeyError as exc:
        raise SchemaMismatchError(
            f"batch {batch}'s files have column {exc} that the Iceberg table {name} no "
            "longer has (another writer changed its schema after the batch was written)",
            fix="restore the column under its old name, then restart the query or run "
            "`sparkeos recover`: the decided batch commits then") from None


def _data_file(table: Any, written: DataFile, spec: Any) -> Any:
    """pyiceberg's ``parquet_file_to_data_file``, but with the partition record phase 1
    computed (pyiceberg infers it from the file's column statistics, which cannot tell a
    bucket or a long string's value) and each column's statistics under the field ID
    the file itself carries (pyiceberg maps them by the table's current names, which
    another writer may have renamed or swapped since)."""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import (
        _check_pyarrow_schema_compatible,
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
        pyarrow_to_schema,
    )
    from pyiceberg.manifest import DataFile as IcebergDataFile
    from pyiceberg.manifest import DataFileContent, FileFormat

    metadata = table.metadata
    schema = metadata.schema()
    with table.io.new_input(written.uri).open() as stream:
        footer = pq.read_metadata(stream)
        size = stream.size()
    in_file = footer.schema.to_arrow_schema()
    _check_pyarrow_schema_compatible(schema, in_file, format_version=metadata.format_version)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=footer,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(pyarrow_to_schema(in_file)))
    return IcebergDataFile.from_args(
        content=DataFileContent.DATA, file_path=written.uri, file_format=FileFormat.PARQUET,
        partition=partitioning.decode(written.partition, spec, schema),
        file_size_in_bytes=size, sort_order_id=None, spec_id=spec.spec_id,
        equality_ids=None, key_metadata=None, **statistics.to_serialized_dict())


def _commit_failures() -> tuple[type[Exception], ...]:
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException

    return CommitFailedException, CommitStateUnknownException


def check_retry_hook() -> None:
    """Refuse a pyiceberg whose commit retry no longer goes through the hook
    ``_BatchTransaction`` overrides: without it a twin committer could add a batch twice."""
    from pyiceberg.table import Transaction

    hook = getattr(Transaction, "_rebuild_snapshot_updates", None)
    if hook is None or not _calls_hook(Transaction.commit_transaction):
        import pyiceberg

        raise ConfigurationError(
            f"pyiceberg {pyiceberg.__version__} retries a commit without the hook the "
            "Iceberg sink relies on to keep a batch from being committed twice",
            fix="install pyiceberg 0.12.0 (pip install 'sparkeos[iceberg]')")


@functools.cache
def _calls_hook(commit_transaction: Any) -> bool:
    """Whether pyiceberg's commit calls the hook (its source read once per process, not
    before every batch)."""
    import inspect

    return "_rebuild_snapshot_updates" in inspect.getsource(commit_transaction)


class _BatchHeld(Exception):
    """Raised out of pyiceberg's retry when the table holds the batch (a twin committed
    it, or this commit landed though reported failed). Not ``CommitFailedException``:
    pyiceberg deletes the files of a transaction that failed so, and they may be the
    ones the table now references (a delete adds no snapshot pyiceberg could find)."""


class _SpecChanged(Exception):
    """Raised out of pyiceberg's retry when the table's partition spec is no longer the
    one the attempt's data files were made for: pyiceberg would put them in a manifest
    of the new spec. The commit builds its files again on the table as it is."""


def _batch_transaction(table: Any, query_key: str, sink: str, batch: int | None) -> Any:
    from pyiceberg.table import Transaction

    spec = partitioning.fingerprint(table.spec()), table.spec().spec_id

    class _BatchTransaction(Transaction):  # type: ignore[misc]
        """A transaction whose own retries stop when the table holds the batch, or when
        its partition spec changed."""

        def _rebuild_snapshot_updates(self) -> None:
            if batch is not None and holds(self._table, query_key, sink, batch):
                raise _BatchHeld(f"batch {batch} is in the table")
            now = self._table.spec()
            if (partitioning.fingerprint(now), now.spec_id) != spec:
                raise _SpecChanged(f"the partition spec changed to {now}")
            super()._rebuild_snapshot_updates()

    return _BatchTransaction(table)


def commit_batch(load: Any, written: Sequence[DataFile], query_key: str, sink: str,
                 batch: int, exactly_once: bool = True,
                 in_spec: Callable[[Any, Sequence[DataFile]], Sequence[DataFile]] | None
                 = None) -> bool:
    """Add the files ``written`` to the table (``load()``: the table, loaded now) in one
    snapshot; False when the table already holds the batch (``exactly_once``; else no
    idempotence: the at-least-once path). ``in_spec(table, written)``: the files in the
    table's partition spec (those written for another rewritten into it)."""
    built: dict[tuple[str, int], list[Any]] = {}

    def append(table: Any, transaction: Any, summary: dict[str, str]) -> _Written:
        spec = partitioning.fingerprint(table.spec()), table.spec().spec_id
        if spec not in built:  # the footers are read once per spec, not per attempt
            files = in_spec(table, written) if in_spec is not None else written
            built[spec] = _data_files(table, files, batch)
        with transaction.update_snapshot(snapshot_properties=summary).fast_append() as add:
            for data_file in built[spec]:
                add.append_data_file(data_file)
        return _Written()  # the attempt's own files: its rollback's and the sweep's

    return _commit(load, query_key, sink, batch, exactly_once, append, _commit_failures())


def merge_batch(load: Any, rows: Any, key: Sequence[str], query_key: str, sink: str,
                batch: int, exactly_once: bool = True) -> bool:
    """Upsert ``rows`` (an Arrow table, one row per key) by ``key``: the table's rows
    with those keys are deleted and ``rows`` added, in one metadata commit with the
    batch's property; False when the table already holds the batch."""
    from pyiceberg.exceptions import ValidationException

    def overwrite(table: Any, transaction: Any, summary: dict[str, str]) -> _Written:
        with warnings.catch_warnings():  # a batch of new keys only: nothing to delete
            warnings.filterwarnings("ignore", "Delete operation did not match any records")
            try:
                transaction.overwrite(rows, overwrite_filter=match_filter(rows, key),
                                      snapshot_properties=summary)
            except ValueError as exc:
                if "Could not find field" not in str(exc):
                    raise
                raise SchemaMismatchError(
                    f"batch {batch}'s key {list(key)} is not in the Iceberg table "
                    f"{'.'.join(table.name())} any more ({exc}: another writer renamed or "
                    "dropped it after the batch was written)", sink=sink, batch_id=batch,
                    fix="restore the key column under its old name, then restart the "
                    "query or run `sparkeos recover`: the decided batch commits then"
                ) from None
        return _written_by(transaction)

    # A concurrent change to the files the delete rewrites fails pyiceberg's validation:
    # nothing landed, so the merge is tried again on the table as it is then.
    return _commit(load, query_key, sink, batch, exactly_once, overwrite,
                   (*_commit_failures(), ValidationException))


def match_filter(rows: Any, key: Sequence[str]) -> Any:
    """The rows of the table whose key is one of ``rows``' keys; a null key matches a
    null key (an aggregation's group may be null)."""
    from pyiceberg import expressions

    e: Any = expressions  # its classes take terms positionally; their stubs say otherwise
    AlwaysFalse, And, EqualTo, In, IsNaN, IsNull, Or = (
        e.AlwaysFalse, e.And, e.EqualTo, e.In, e.IsNaN, e.IsNull, e.Or)

    def term(column: str, value: Any) -> Any:
        if value is None:
            return IsNull(column)
        return IsNaN(column) if _is_nan(value) else EqualTo(column, value)

    values = [rows.column(k).to_pylist() for k in key]
    if len(key) == 1:
        present = sorted({v for v in values[0] if v is not None and not _is_nan(v)})
        found: Any = In(key[0], present) if present else AlwaysFalse()
        if None in values[0]:
            found = Or(found, IsNull(key[0]))
        return Or(found, IsNaN(key[0])) if any(map(_is_nan, values[0])) else found
    rows_matched: list[Any] = [And(*[term(k, v) for k, v in zip(key, row, strict=True)])
                               for row in set(zip(*values, strict=True))]
    if not rows_matched:
        return AlwaysFalse()
    while len(rows_matched) > 1:  # a balanced tree: pyiceberg visits it recursively
        pairs = zip(rows_matched[::2], rows_matched[1::2], strict=False)
        rows_matched = [Or(a, b) for a, b in pairs] + (
            [rows_matched[-1]] if len(rows_matched) % 2 else [])
    return rows_matched[0]


def _is_nan(value: Any) -> bool:
    """NaN, a group of its own in Spark's aggregations, is no literal in Iceberg's
    expressions (``IsNaN`` matches it)."""
    return isinstance(value, float) and math.isnan(value)


def _commit(load: Any, query_key: str, sink: str, batch: int, exactly_once: bool,
            build: Any, retried: tuple[type[Exception], ...]) -> bool:
    """One metadata commit of what ``build(table, transaction, summary)`` adds, with the
    batch's property, tried again on the table as it is when another writer committed
    first (``retried``). ``build`` returns the data files it had pyiceberg write for the
    attempt (``_written_by``): those of attempts known not to have landed are deleted
    (``_drop_unlanded``)."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    summary = {"sparkeos.app": f"{query_key}.{sink}", "sparkeos.query": query_key,
               "sparkeos.sink": sink, "sparkeos.batch": str(batch)}
    marker = batch_property(query_key, sink) if exactly_once else (
        f"{WRITTEN_PREFIX}{query_key}.{sink}")
    table = None
    failed: list[_Written] = []  # attempts refused: by the catalog, or a twin's batch
    try:
        for _ in range(COMMIT_ATTEMPTS):
            table = load()
            if exactly_once and holds(table, query_key, sink, batch):
                return False
            transaction = _batch_transaction(table, query_key, sink,
                                             batch if exactly_once else None)
            written = build(table, transaction, summary)
            transaction.set_properties({marker: str(batch)})
            try:
                transaction.commit_transaction()
                return True
            except _BatchHeld:
                failed.append(written)
                return False
            except _SpecChanged:
                failed.append(written)
                continue  # built again for the spec the table has now
            except (CommitFailedException, ValidationException) as exc:
                failed.append(written)
                if not isinstance(exc, retried):
                    raise
            except retried:
                continue  # its outcome unknown: it may land yet, so its files stay
    finally:
        if failed:
            _drop_unlanded(load, failed, sink, batch)
    name = ".".join(table.name()) if table is not None else "?"
    raise RetriableError(
        f"the Iceberg table {name} changed under {COMMIT_ATTEMPTS} commits of batch "
        f"{batch} in a row (other writers commit to it all the time)", sink=sink,
        batch_id=batch, fix=("the batch is still decided: restart the query (or run "
                             "`sparkeos recover`) once the other writers calm down")
        if exactly_once else "Spark runs the task again; if this repeats, write under "
        "exactly-once, which commits a batch once instead of once per task")


@dataclass(frozen=True)
class _Written:
    """The data files pyiceberg wrote for one attempt, and the snapshots it would add."""

    snapshots: frozenset[int] = frozenset()
    files: tuple[str, ...] = ()


def _written_by(transaction: Any) -> _Written:
    """What pyiceberg wrote for ``transaction`` (a merge's new rows and the files its
    delete rewrote): a commit that does not land leaves the data files behind, and
    pyiceberg deletes only its manifests then. Its internal retries keep the same files
    and snapshot IDs."""
    producers = list(getattr(transaction, "_snapshot_producers", ()))
    return _Written(
        frozenset(int(p._snapshot_id) for p in producers if hasattr(p, "_snapshot_id")),
        tuple(data_file.file_path for p in producers
              for data_file in getattr(p, "_added_data_files", ())))


def _drop_unlanded(load: Any, attempts: Sequence[_Written], sink: str, batch: int) -> None:
    """Delete the files of refused attempts whose snapshots the table does not hold (a
    commit reported refused may have landed: a lost reply). Never fails the commit: a
    file left is an orphan for Iceberg's orphan-file removal, not an error."""
    try:
        table = load()
        held = {s.snapshot_id for s in table.snapshots()}
        for attempt in attempts:
            if not attempt.snapshots or attempt.snapshots & held:
                continue  # landed, or nothing to tell it by: its files stay
            for uri in attempt.files:
                try:
                    table.io.delete(uri)
                except FileNotFoundError:
                    pass
    except Exception as exc:
        log_event("iceberg.cleanup_failed", logging.WARNING, sink=sink, batch=batch,
                  cause=str(exc))


def referenced(table: Any, uris: Iterable[str]) -> set[str]:
    """Which of ``uris`` a snapshot still in the table's metadata references (current
    or not: an older snapshot may still be read by time travel). Reads every distinct
    manifest once: only for a rollback that finds an attempt's files on disk."""
    wanted = set(uris)
    found: set[str] = set()
    seen: set[str] = set()
    for snapshot in table.snapshots():
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen:
                continue
            seen.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.data_file.file_path in wanted:
                    found.add(entry.data_file.file_path)
            if found == wanted:
                return found
    return found


def other_queries(table: Any, query_key: str, sink: str) -> list[str]:
    """Query keys other than ``query_key`` that committed ``sink`` here: the table's
    properties (which outlive snapshot expiry), and the summaries of the snapshots
    still in its metadata (read from the metadata in hand, no file)."""
    found: set[str] = set()
    for name in table.properties:
        for prefix in (BATCH_PREFIX, WRITTEN_PREFIX):
            if name.startswith(prefix):
                key, _, named = name[len(prefix):].partition(".")
                if named == sink:
                    found.add(key)
    for snapshot in table.snapshots():
        summary = snapshot.summary
        if summary is not None and summary.get("sparkeos.sink") == sink \
                and summary.get("sparkeos.query"):
            found.add(str(summary.get("sparkeos.query")))
    return sorted(found - {query_key})


__all__ = ["BATCH_PREFIX", "COMMIT_ATTEMPTS", "WRITTEN_PREFIX", "batch_property",
           "commit_batch", "committed_batch", "holds", "other_queries", "referenced"]
