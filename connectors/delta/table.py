"""The Delta table's log, through delta-rs (``deltalake``): one commit adds every file of
a batch, with a ``SetTransaction`` of the sink's app ID and the batch as its version.
Delta's own rule makes it idempotent: the commit first reads the app ID's version and
does nothing when it holds the batch; two committers of one batch at once are told
apart by delta-rs' conflict check (a concurrent commit of the same app ID fails, and
the loser reads the version again). The first commit creates the table.

Which queries wrote a sink name into the table is recorded beside the log, for the
lost-checkpoint check (an app ID holds its query's key, and delta-rs can only be asked
for the version of an app ID it is given): ``<table>/_sparkeos/queries/<sink>/<key>``,
written before the query's first commit.
"""

from __future__ import annotations

import json
import posixpath
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from sparkeos.core.errors import ConfigurationError, RetriableError
from sparkeos.core.storage.attempts import TableFiles

from .files import SPARKEOS_DIR, DataFile
from .stores import storage_options, table_uri, with_credentials

T = TypeVar("T")
COMMIT_ATTEMPTS = 20
"""Commits retried after a conflict (another writer committed first) before giving up."""


def app_id(query_key: str, sink: str) -> str:
    return f"sparkeos.{query_key}.{sink}"


_OPEN = threading.local()
"""This thread's loaded tables by location: brought up to date (``update_incremental``)
instead of loaded again, so a commit does not read the whole log (a stream's table
grows by a version per batch). Per thread: delta-rs' table objects take one caller at
a time."""


def _table(where: TableFiles) -> Any:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    tables: dict[tuple[str, str], Any] = getattr(_OPEN, "tables", None) or {}
    _OPEN.tables = tables
    location, options = table_uri(where), storage_options(where)
    cache_key = (location, repr(sorted((options or {}).items())))
    cached = tables.get(cache_key)
    if cached is not None:
        try:
            cached.update_incremental()
            return cached
        except Exception:  # replaced or removed underneath: load it afresh
            tables.pop(cache_key, None)
    try:
        # Not ``DeltaTable.is_deltatable``: it holds the GIL while it waits on the store
        # (deltalake 1.6), which stalls every other thread of the process meanwhile.
        table = tables[cache_key] = DeltaTable(
            location, storage_options=with_credentials(where, options))
    except TableNotFoundError:
        return None
    return table


def _forget(where: TableFiles) -> None:
    tables: dict[tuple[str, str], Any] = getattr(_OPEN, "tables", {})
    location = table_uri(where)
    for cache_key in [k for k in tables if k[0] == location]:
        tables.pop(cache_key, None)


def _read(where: TableFiles, read: Callable[[Any], T], empty: T) -> T:
    """``read(table)``; ``empty`` without a table. A cached table that fails is
    loaded afresh once (the table may have been replaced at its path)."""
    return _reached(where, lambda: _read_loaded(where, read, empty))


def _read_loaded(where: TableFiles, read: Callable[[Any], T], empty: T) -> T:
    for fresh in (False, True):
        table = _table(where)
        if table is None:
            return empty
        try:
            return read(table)
        except Exception:
            _forget(where)
            if fresh:
                raise
    raise AssertionError("unreachable")


def _reached(where: TableFiles, call: Callable[[], T]) -> T:
    """``call()``, a store that delta-rs cannot reach (``OSError``) said with where and
    the fix (retried with the batch)."""
    try:
        return call()
    except OSError as exc:
        raise RetriableError(
            f"delta-rs cannot reach the Delta table at {where.uri()} "
            f"({table_uri(where)}): {str(exc).splitlines()[0] if str(exc) else exc!r}",
            fix=_reach_fix(where)) from None


def _reach_fix(where: TableFiles) -> str:
    endpoint_fix = getattr(where.files, "endpoint_fix", None)
    if endpoint_fix is not None:
        found = str(endpoint_fix())
    elif getattr(where.files, "scheme", "") == "hdfs":
        found = ("check the NameNode's RPC port in the path, that it is up and out of "
                 "safe mode, HADOOP_CONF_DIR for a nameservice, and that HADOOP_USER_NAME "
                 "is not set empty")
    else:
        found = "check the table's location"
    return found + "; and the credentials of every process; retried with the batch"


def committed_version(where: TableFiles, query_key: str, sink: str) -> int | None:
    """The last batch the table holds for this (query, sink); None if none."""
    app = app_id(query_key, sink)

    def version(table: Any) -> int | None:
        found = table.transaction_version(app)
        return None if found is None else int(found)

    return _read(where, version, None)


def referenced(where: TableFiles) -> set[str]:
    """The paths (relative, unescaped as the manifests hold them) of every file the
    table's current version references."""
    def paths(table: Any) -> set[str]:
        column = table.get_add_actions(flatten=True).column("path").to_pylist()
        return {urllib.parse.unquote(str(p)) for p in column}

    return _read(where, paths, set())


def partition_columns(where: TableFiles) -> list[str] | None:
    return _read(where, lambda table: list(table.metadata().partition_columns), None)


def _queries_dir(where: TableFiles, sink: str) -> str:
    return where.path(posixpath.join(SPARKEOS_DIR, "queries", sink))


def record_query(where: TableFiles, query_key: str, sink: str) -> None:
    directory = _queries_dir(where, sink)
    path = posixpath.join(directory, query_key)
    if not where.files.exists(path):
        where.files.makedirs(directory)
        try:
            where.files.create_new(path, b"")
        except FileExistsError:
            pass  # another committer of the query recorded it


def other_queries(where: TableFiles, query_key: str, sink: str) -> list[str]:
    """Query keys other than ``query_key`` that committed ``sink`` here: the records
    beside the log, and the commits' own metadata (a copy of the table that lost the
    records still has its log)."""
    found = set(where.files.listdir(_queries_dir(where, sink))) | _committed_by(where, sink)
    return sorted(found - {query_key})


def _committed_by(where: TableFiles, sink: str) -> set[str]:
    """The query keys in the ``commitInfo`` of the log's commits of ``sink``, read
    through the store (not ``DeltaTable.history``, which holds the GIL while it waits on
    the store: every other thread of the driver stalls meanwhile)."""
    log = "_delta_log"
    found: set[str] = set()
    for name in where.files.listdir(where.path(log)):
        if not (name.endswith(".json") and name[:-5].isdigit()):
            continue
        try:
            data = where.read(f"{log}/{name}")
        except FileNotFoundError:
            continue  # cleaned up by a checkpoint meanwhile
        for line in data.decode().splitlines():
            info = json.loads(line).get("commitInfo") if line.strip() else None
            if info and info.get("sparkeos.sink") == sink and info.get("sparkeos.query"):
                found.add(str(info["sparkeos.query"]))
    return found


def commit_batch(where: TableFiles, schema: pa.Schema, partition_by: Sequence[str],
                 files: Sequence[DataFile], query_key: str, sink: str, batch: int,
                 app_version: bool = True) -> bool:
    """Add ``files`` to the table in one commit; False when the table already holds
    the batch (``app_version``: under the sink's app ID, else no idempotence: the
    at-least-once path)."""
    from deltalake.transaction import AddAction

    now = int(time.time() * 1000)
    actions = [AddAction(f.path, f.size, f.partition_values, now, True,
                         f'{{"numRecords":{f.rows}}}') for f in files]

    def append(table: Any, properties: Any) -> None:
        table.create_write_transaction(actions, "append", schema,
                                       partition_by=list(partition_by) or None,
                                       commit_properties=properties)

    return _once(where, schema, partition_by, query_key, sink, batch, app_version, append)


def merge_batch(where: TableFiles, schema: pa.Schema, partition_by: Sequence[str],
                key: Sequence[str], staged: Sequence[str], query_key: str, sink: str,
                batch: int, app_version: bool = True) -> bool:
    """MERGE the staged rows into the table by ``key`` (matched: every column
    updated; not matched: inserted) in one commit; False when the table already holds
    the batch (as ``commit_batch``)."""
    import pyarrow.parquet as pq

    from .upsert import merge_predicate

    def merge(table: Any, properties: Any) -> None:
        source = pa.concat_tables([pq.read_table(pa.BufferReader(where.read(path)))
                                   for path in staged]).cast(schema)
        (table.merge(source, merge_predicate(key), source_alias="s", target_alias="t",
                     commit_properties=properties)
         .when_matched_update_all().when_not_matched_insert_all().execute())

    return _once(where, schema, partition_by, query_key, sink, batch, app_version, merge)


def _once(where: TableFiles, schema: pa.Schema, partition_by: Sequence[str], query_key: str,
          sink: str, batch: int, app_version: bool,
          commit: Callable[[Any, Any], None]) -> bool:
    """``commit(table, properties)`` until it goes through, unless the table holds the
    batch already (read again after every conflict: a twin may have committed it)."""
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties, Transaction

    app = app_id(query_key, sink)
    for _ in range(COMMIT_ATTEMPTS):
        table = _table(where)
        if table is None:
            _create(where, schema, partition_by)
            continue
        done = table.transaction_version(app) if app_version else None
        if done is not None and done >= batch:
            return False
        properties = CommitProperties(
            app_transactions=[Transaction(app, batch)] if app_version else None,
            custom_metadata={"sparkeos.sink": sink, "sparkeos.query": query_key,
                             "sparkeos.batch": batch})
        try:
            commit(table, properties)
            return True
        except CommitFailedError:
            del table
            _forget(where)
    raise RetriableError(
        f"the Delta table at {where.uri()} changed under {COMMIT_ATTEMPTS} commits of batch "
        f"{batch} in a row (other writers commit to it all the time)", sink=sink,
        batch_id=batch, fix="the batch is still decided: restart the query (or run "
        "`sparkeos recover`) once the other writers calm down")


def _create(where: TableFiles, schema: pa.Schema, partition_by: Sequence[str]) -> None:
    from deltalake import DeltaTable

    location, options = table_uri(where), storage_options(where)
    try:
        DeltaTable.create(location, schema, mode="error",
                          partition_by=list(partition_by) or None,
                          storage_options=with_credentials(where, options))
    except Exception as exc:
        if _reached(where, lambda: _table(where)) is not None:
            return  # another committer created it first
        if isinstance(exc, OSError) and not isinstance(exc, PermissionError):
            # the store unreachable or throttling: not the table
            raise RetriableError(f"cannot create a Delta table at {location}: {exc}",
                                 fix=_reach_fix(where)) from None
        raise ConfigurationError(f"cannot create a Delta table at {location}: {exc}",
                                 fix="check the location and its permissions") from None


def table_schema(where: TableFiles) -> pa.Schema | None:
    return _read(where, lambda table: pa.schema(table.schema().to_arrow()), None)


__all__ = ["COMMIT_ATTEMPTS", "app_id", "commit_batch", "committed_version", "merge_batch",
           "other_queries", "partition_columns", "record_query", "referenced", "table_schema"]
