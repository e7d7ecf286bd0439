"""IcebergSink's protocol against a real Iceberg table (pyiceberg, a SQL catalog on
SQLite), without Spark: one snapshot per batch, idempotent commits, a crash at every
protocol point, what a rollback may delete, the lost-checkpoint guard, other writers and
a twin committing meanwhile, snapshot expiry, and what is refused up front."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkeos.connectors.iceberg import IcebergSink
from sparkeos.connectors.iceberg import table as iceberg_table
from sparkeos.connectors.iceberg.files import DataFile
from sparkeos.connectors.iceberg.format import IcebergFormat
from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import AttemptFencedError, ConfigurationError, SchemaMismatchError
from sparkeos.core.faults import ALL_POINTS
from sparkeos.core.protocol import Receipt, Transaction
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.txpool import TransactionPool
from sparkeos.testing.inprocess import ListRunner, MemoryStore, crash_then_finish

POOL = TransactionPool("q1", "orders")
SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])


def catalog(tmp_path: Path) -> dict[str, str]:
    os.makedirs(tmp_path / "warehouse", exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": f"file://{tmp_path}/warehouse"}


def make_sink(tmp_path: Path, name: str = "db.orders") -> IcebergSink:
    sink = IcebergSink(name, catalog=catalog(tmp_path))
    sink.validate(SCHEMA)
    return sink


def rows(ids: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.int64()),
                                       "payload": [f"p{i}" for i in ids]})


def prepared(sink: IcebergSink, batch_id: int, partition: int, ids: list[int],
             pool: TransactionPool = POOL) -> tuple[Transaction, Receipt]:
    txn = pool.transaction(batch_id, partition, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, rows(ids))
    return txn, sink.prepare(handle)


def loaded(sink: IcebergSink) -> Any:
    return sink._load()


def visible(sink: IcebergSink) -> list[int]:
    found = loaded(sink)
    return [] if found is None else sorted(found.scan().to_arrow().column("id").to_pylist())


def data_files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "warehouse").rglob("*.parquet"))


def test_a_batch_is_one_snapshot_and_a_second_commit_does_nothing(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    items = [prepared(sink, 0, 0, [1, 2]), prepared(sink, 0, 1, [3])]
    assert visible(sink) == []  # prepared files are referenced by no snapshot
    sink.commit_merged(items, recovering=False)
    sink.commit_merged(items, recovering=True)  # a twin, or a replayed commit: no-op
    table = loaded(sink)
    assert visible(sink) == [1, 2, 3] and len(table.snapshots()) == 1
    summary = table.current_snapshot().summary
    assert summary.get("sparkeos.app") == "q1.orders" and summary.get("sparkeos.batch") == "0"
    assert table.properties["sparkeos.batch.q1.orders"] == "0"
    assert not (tmp_path / "warehouse" / "db" / "orders" / "_sparkeos" / "attempts").exists() \
        or not os.listdir(tmp_path / "warehouse" / "db" / "orders" / "_sparkeos" / "attempts")


def test_files_carry_the_table_field_ids_and_types(tmp_path: Path) -> None:
    """Timestamps in nanoseconds with a zone (as a Spark batch may hand them) go in as
    Iceberg's microsecond timestamptz, with the table's field IDs in the file."""
    import pyarrow.parquet as pq

    schema = pa.schema([("id", pa.int64()), ("at", pa.timestamp("ns", tz="Europe/Paris"))])
    sink = IcebergSink("db.events", catalog=catalog(tmp_path))
    sink.validate(schema)
    at = datetime.datetime(2026, 11, 28, 12, 0, 0, 123456, tzinfo=datetime.timezone.utc)
    txn = POOL.transaction(0, 0, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, pa.RecordBatch.from_pydict(
        {"id": [1], "at": pa.array([at], pa.timestamp("ns", tz="Europe/Paris"))}))
    sink.commit(txn, sink.prepare(handle))
    table = loaded(sink)
    assert str(table.schema().find_field("at").field_type) == "timestamptz"
    assert table.scan().to_arrow().column("at").to_pylist() == [at]
    written = pq.read_schema(handle.written[0].uri.removeprefix("file://"))
    assert written.field("at").metadata[b"PARQUET:field_id"] == b"2"


@pytest.mark.parametrize("point", ALL_POINTS)
def test_a_crash_at_every_protocol_point_then_a_restart(tmp_path: Path, point: str) -> None:
    sink = make_sink(tmp_path)
    log = CommitLog(MemoryStore())
    crash_then_finish(lambda faults: Coordinator(sink, CoordinatorConfig(name="orders"),
                                                 log, "qtest", faults),
                      [[[1, 2], [3]], [[4], [5, 6]], [[7], [8]]], point)
    assert visible(sink) == list(range(1, 9))
    assert len(loaded(sink).snapshots()) == 3  # one per batch
    root = tmp_path / "warehouse" / "db" / "orders"
    assert not any((root / "_sparkeos").rglob("*.json"))
    assert len(data_files(tmp_path)) == 6  # every file a snapshot references, no other


def test_a_rollback_deletes_only_what_no_snapshot_references(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    committed = prepared(sink, 0, 0, [1])
    sink.commit_merged([committed], recovering=False)
    kept = prepared(sink, 0, 1, [9])  # a loser attempt of the same, committed batch
    receipt = dict(committed[1])
    # A manifest left beside a committed attempt (a crash before its deletion): the
    # rollback must keep the files a snapshot references.
    os.makedirs(os.path.dirname(_manifest(tmp_path, committed[0])), exist_ok=True)
    with open(_manifest(tmp_path, committed[0]), "w") as fh:
        json.dump({"files": [receipt["files"][0]["path"]]}, fh)
    sink.rollback(committed[0])
    sink.rollback(kept[0])
    sink.rollback(POOL.transaction(7, 0, 0, 0))  # never used: fine
    assert visible(sink) == [1] and len(data_files(tmp_path)) == 1
    assert not os.listdir(tmp_path / "warehouse" / "db" / "orders" / "_sparkeos" / "attempts")


def _manifest(tmp_path: Path, txn: Transaction) -> str:
    return str(tmp_path / "warehouse" / "db" / "orders" / "_sparkeos" / "attempts"
               / f"{txn.txn_id}.json")


def test_a_zombie_of_a_committed_attempt_id_is_fenced(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    txn, receipt = prepared(sink, 0, 0, [1])
    sink.commit(txn, receipt)
    sink.recover_commit(txn, receipt)
    with pytest.raises(AttemptFencedError):
        prepared(sink, 0, 0, [9])
    assert visible(sink) == [1]


def test_a_new_checkpoint_over_committed_batches_is_refused(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    Coordinator(sink, CoordinatorConfig(name="orders"), CommitLog(MemoryStore()),
                "q1").run_batch(0, ListRunner([[1], [2]]))
    assert sink.output_of_other_queries("q1", "orders") is None
    assert "q1" in (sink.output_of_other_queries("q2", "orders") or "")
    assert sink.output_of_other_queries("q2", "other-sink") is None
    fresh = Coordinator(sink, CoordinatorConfig(name="orders"), CommitLog(MemoryStore()), "q2")
    with pytest.raises(ConfigurationError, match="existing_output='accept'"):
        fresh.run_batch(0, ListRunner([[1], [2]]))
    accepted = Coordinator(sink, CoordinatorConfig(name="orders", existing_output="accept"),
                           CommitLog(MemoryStore()), "q3")
    accepted.run_batch(0, ListRunner([[5]]))
    assert visible(sink) == [1, 2, 5]


def test_the_batch_is_still_found_after_snapshot_expiry(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    first = prepared(sink, 0, 0, [1])
    sink.commit_merged([first], recovering=False)
    for batch_id in (1, 2):
        sink.commit_merged([prepared(sink, batch_id, 0, [batch_id + 1])], recovering=False)
    table = loaded(sink)
    current = table.current_snapshot().snapshot_id
    older = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current]
    table.maintenance.expire_snapshots().by_ids(older).commit()
    assert len(loaded(sink).snapshots()) == 1
    sink.commit_merged([first], recovering=True)  # batch 0 again: found by the property
    assert visible(sink) == [1, 2, 3]
    assert "q1" in (sink.output_of_other_queries("q2", "orders") or "")


def test_another_appender_between_prepare_and_commit_is_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer commits after the committer loaded the table: the catalog refuses
    the stale commit, and it goes through on the new metadata, nothing lost."""
    sink = make_sink(tmp_path)
    items = [prepared(sink, 0, 0, [1]), prepared(sink, 0, 1, [2])]
    other = IcebergSink("db.orders", catalog=catalog(tmp_path))
    stale = _stale_loads(monkeypatch, lambda: other._load().append(
        pa.Table.from_batches([rows([100])]).cast(SCHEMA)))
    sink.commit_merged(items, recovering=False)
    assert stale and visible(sink) == [1, 2, 100]
    assert loaded(sink).properties["sparkeos.batch.q1.orders"] == "0"


def test_a_twin_that_commits_the_batch_meanwhile_is_not_doubled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The twin commits the batch after this committer read the property and loaded the
    table: pyiceberg's own retry would append the batch again on the new metadata; the
    sink's transaction stops it there."""
    sink = make_sink(tmp_path)
    items = [prepared(sink, 0, 0, [1]), prepared(sink, 0, 1, [2])]
    twin = IcebergSink("db.orders", catalog=catalog(tmp_path))
    twin_items = [(txn, dict(receipt)) for txn, receipt in items]
    stale = _stale_loads(monkeypatch, lambda: iceberg_table.commit_batch(
        twin._load, [DataFile.from_json(f) for _, r in twin_items for f in r["files"]],
        "q1", "orders", 0))
    sink.commit_merged(items, recovering=False)
    assert stale and visible(sink) == [1, 2] and len(loaded(sink).snapshots()) == 1


def _stale_loads(monkeypatch: pytest.MonkeyPatch, meanwhile: Any) -> list[int]:
    """The next table the commit loads goes stale at once: ``meanwhile`` commits."""
    calls: list[int] = []
    original = IcebergSink._load

    def load(self: IcebergSink) -> Any:
        found = original(self)
        if not calls:
            calls.append(1)
            meanwhile()
        return found

    monkeypatch.setattr(IcebergSink, "_load", load)
    return calls


def test_at_least_once_commits_each_task(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    per_task = sink.for_guarantee(Guarantee.AT_LEAST_ONCE)
    for partition in (0, 1):
        txn, receipt = prepared(per_task, 0, partition, [partition])
        per_task.commit(txn, receipt)
    table = loaded(sink)
    assert visible(sink) == [0, 1] and len(table.snapshots()) == 2
    assert "sparkeos.batch.q1.orders" not in table.properties
    assert "q1" in (sink.output_of_other_queries("q2", "orders") or "")


def test_what_the_sink_cannot_do_is_refused_up_front(tmp_path: Path) -> None:
    good = catalog(tmp_path)
    with pytest.raises(ConfigurationError, match="SQL catalog"):
        IcebergSink("db.orders", catalog={"type": "rest", "uri": "http://localhost:8181"})
    with pytest.raises(ConfigurationError, match="uri"):
        IcebergSink("db.orders", catalog={"type": "sql"})
    with pytest.raises(ConfigurationError, match="libhdfs"):
        IcebergSink("db.orders", catalog={**good, "warehouse": "hdfs://namenode:8020/wh"})
    with pytest.raises(ConfigurationError, match="Azure Blob Storage, not warehouse=oss://"):
        IcebergSink("db.orders", catalog={**good, "warehouse": "oss://bucket/wh"})
    with pytest.raises(ConfigurationError, match="namespace"):
        IcebergSink("orders", catalog=good)
    with pytest.raises(ConfigurationError, match="warehouse"):
        IcebergSink("db.orders", catalog={k: v for k, v in good.items() if k != "warehouse"})
    with pytest.raises(ConfigurationError, match="relative"):
        IcebergSink("db.orders", catalog={**good, "warehouse": "relative/wh"})
    with pytest.raises(ConfigurationError, match="relative"):
        IcebergSink("db.orders", catalog={**good, "uri": "sqlite:///relative/catalog.db"})
    assert set(IcebergSink("db.orders", catalog=good).shared_paths()) == {
        f"{tmp_path}/warehouse", str(tmp_path)}
    with pytest.raises(ConfigurationError, match="catalog's properties"):
        IcebergSink("db.orders")
    sink = make_sink(tmp_path)
    assert IcebergSink.from_description(sink.describe()) == sink  # for `sparkeos recover`
    with pytest.raises(SchemaMismatchError, match="columns"):
        sink.validate(pa.schema([("id", pa.int64())]))
    with sink._catalog().create_table("db.parted", schema=SCHEMA).update_spec() as spec:
        spec.add_identity("id")
    with pytest.raises(ConfigurationError, match=r"partitioned by \['id'\], the sink by"):
        IcebergSink("db.parted", catalog=good, partition_by=["payload"]).validate(SCHEMA)
    assert "secret" not in str(IcebergSink(
        "db.orders", catalog={**good, "uri": "postgresql://u:secret@localhost/cat"}).describe())


def test_the_format_takes_the_catalog_from_its_options(tmp_path: Path) -> None:
    options = {"path": "db.orders", "checkpointLocation": str(tmp_path / "ckpt"),
               **{f"sparkeos.catalog.{k}": v for k, v in catalog(tmp_path).items()}}
    sink, settings = IcebergFormat(options=options)._sink_and_settings(SCHEMA)
    assert isinstance(sink, IcebergSink) and sink.table == "db.orders"
    assert dict(sink.catalog) == catalog(tmp_path) and settings.config.name == "sink"


def test_a_commit_is_quick_on_a_table_with_history(tmp_path: Path) -> None:
    """The committed batch is a property: the hundredth commit reads no more than the
    first (no walk through the snapshots)."""
    sink = make_sink(tmp_path)
    started = time.monotonic()
    for batch_id in range(30):
        sink.commit_merged([prepared(sink, batch_id, 0, [batch_id])], recovering=False)
    assert visible(sink) == list(range(30))
    assert time.monotonic() - started < 60


def test_conflicts_in_a_row_leave_the_batch_decided_with_a_clear_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table import Transaction as IcebergTransaction

    from sparkeos.core.errors import RetriableError

    sink = make_sink(tmp_path)
    items = [prepared(sink, 0, 0, [1])]

    def conflict(self: IcebergTransaction) -> None:
        raise CommitFailedException("another writer won")

    monkeypatch.setattr(iceberg_table, "COMMIT_ATTEMPTS", 3)
    monkeypatch.setattr(IcebergTransaction, "commit_transaction", conflict)
    with pytest.raises(RetriableError, match="still decided"):
        sink.commit_merged(items, recovering=False)
    monkeypatch.undo()
    sink.commit_merged(items, recovering=True)  # the restart's recovery commits it
    assert visible(sink) == [1]


def test_the_table_reads_back_as_pyicebergs_own_append_of_the_same_rows(
        tmp_path: Path) -> None:
    """No Iceberg runtime exists for the pinned Spark (docs/connectors/iceberg.md): the
    comparison is with pyiceberg's own writer, on a table made from the same schema."""
    sink = make_sink(tmp_path)
    sink.commit_merged([prepared(sink, 0, 0, [1, 2]), prepared(sink, 0, 1, [3])],
                       recovering=False)
    theirs = sink._catalog().create_table("db.theirs", schema=SCHEMA)
    theirs.append(pa.Table.from_batches([rows([1, 2, 3])]))
    ours = loaded(sink).scan().to_arrow().sort_by("id")
    read_back = sink._catalog().load_table("db.theirs").scan().to_arrow().sort_by("id")
    assert ours.schema == read_back.schema and ours.to_pylist() == read_back.to_pylist()
    assert loaded(sink).schema() == sink._catalog().load_table("db.theirs").schema()


def test_a_column_dropped_after_phase_1_is_refused_with_the_fix(tmp_path: Path) -> None:
    """Another writer drops a column between prepare and commit: the decided batch
    cannot commit as written; the error says so and how to go on, and nothing lands."""
    sink = make_sink(tmp_path)
    items = [prepared(sink, 0, 0, [1, 2])]
    with loaded(sink).update_schema() as update:
        update.delete_column("payload")
    with pytest.raises(SchemaMismatchError, match="restore the column"):
        sink.commit_merged(items, recovering=False)
    assert loaded(sink).current_snapshot() is None


def test_a_column_renamed_after_phase_1_is_followed(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    items = [prepared(sink, 0, 0, [1, 2])]
    with loaded(sink).update_schema() as update:
        update.rename_column("payload", "body")
    sink.commit_merged(items, recovering=False)
    table = loaded(sink)
    assert table.scan(row_filter="body == 'p2'").to_arrow().column("id").to_pylist() == [2]


def test_a_pyiceberg_without_the_retry_hook_is_refused(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from pyiceberg.table import Transaction as IcebergTransaction

    iceberg_table.check_retry_hook()  # the pinned pyiceberg has it
    monkeypatch.delattr(IcebergTransaction, "_rebuild_snapshot_updates")
    with pytest.raises(ConfigurationError, match=r"pyiceberg 0\.12\.0"):
        IcebergSink("db.orders", catalog=catalog(tmp_path)).validate(SCHEMA)


def test_the_warehouse_store_is_the_catalogs_and_secrets_are_masked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog's own ``s3.endpoint`` is where sparkeos' files go too (one store for
    pyiceberg's metadata and the attempts' files); a table spelled ``s3://`` in an
    ``s3a://`` warehouse is served by the warehouse's store; secrets are not recorded."""
    from sparkeos.connectors.iceberg import stores

    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    properties = {**catalog(tmp_path), "warehouse": "s3a://lake/wh",
                  "s3.endpoint": "http://store:9000/", "s3.secret-access-key": "hush"}
    sink = IcebergSink("db.orders", catalog=properties)
    assert sink.store.warehouse is not None and sink.store.warehouse.endpoint == "http://store:9000"
    split = sink.store.table_files("s3://lake/wh/db/orders")
    assert split.files is sink.store.warehouse and split.root == "/wh/db/orders"
    assert sink.store.table_files("s3://elsewhere/t").files is not sink.store.warehouse
    assert "hush" not in str(sink.describe())
    # no region set anywhere and no endpoint: pyiceberg finds the bucket's region itself
    bare = {**catalog(tmp_path), "warehouse": "s3a://lake/wh"}
    assert stores.io_properties(bare, stores.warehouse_store(bare)) == {}


def test_gcs_and_azure_warehouses_tell_pyiceberg_the_store_sparkeos_resolved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One resolution on the driver for both writers: pyiceberg gets the emulator's
    endpoint (GCS) or the account's authority and scheme (Azure) and sparkeos' FileIO;
    the account key is added where the catalog is opened, never kept in the sink; a
    catalog's own endpoint setting is where sparkeos' files go too."""
    from sparkeos.connectors.iceberg import stores
    from sparkeos.connectors.iceberg.fileio import SparkeosFileIO

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
    gcs = IcebergSink("db.orders", catalog={**catalog(tmp_path), "warehouse": "gs://lake/wh"})
    assert gcs.__dict__["_io"] == {"gcs.service.host": "http://127.0.0.1:1",
                                   "py-io-impl": stores.FILE_IO}
    own = {**catalog(tmp_path), "warehouse": "gs://lake/wh", "gcs.service.host": "http://h:2"}
    assert IcebergSink("db.orders", catalog=own).store.warehouse.endpoint == "http://h:2"  # type: ignore[union-attr]

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       "AccountName=acct;AccountKey=s3cr3t;BlobEndpoint=http://127.0.0.1:3/acct")
    properties = {**catalog(tmp_path), "warehouse": "abfss://lake@acct.dfs.core.windows.net/wh"}
    azure = IcebergSink("db.orders", catalog=properties)
    assert azure.__dict__["_io"] == {
        "adls.account-name": "acct", "adls.blob-storage-authority": "127.0.0.1:3",
        "adls.dfs-storage-authority": "127.0.0.1:3", "adls.blob-storage-scheme": "http",
        "adls.dfs-storage-scheme": "http", "py-io-impl": stores.FILE_IO}
    assert "s3cr3t" not in repr(azure.__dict__) and "s3cr3t" not in str(azure.describe())
    assert stores.io_credentials(azure.catalog, azure.store.warehouse) == {
        "adls.account-key": "s3cr3t"}
    split = azure.store.table_files("abfss://lake@acct.dfs.core.windows.net/wh/db/orders")
    assert split.files is azure.store.warehouse and split.root == "/wh/db/orders"
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    real = stores.io_properties(properties, stores.warehouse_store(properties))
    assert real["adls.blob-storage-authority"] == ".blob.core.windows.net"
    assert real["adls.dfs-storage-authority"] == ".dfs.core.windows.net"
    # an Azure table outside the warehouse's container as spelled there: refused
    stores.check_table_location(azure.store.warehouse,
                                "abfss://lake@acct.dfs.core.windows.net/wh/db/t", "t")
    stores.check_table_location(azure.store.warehouse,  # another spelling, one container
                                "wasbs://lake@acct.blob.core.windows.net/wh/db/t", "t")
    for elsewhere in ("abfss://lake@other.dfs.core.windows.net/wh/db/t",
                      "abfss://pond@acct.dfs.core.windows.net/wh/db/t"):
        with pytest.raises(ConfigurationError, match="not in the warehouse's container"):
            stores.check_table_location(azure.store.warehouse, elsewhere, "t")
    # a custom domain Arrow cannot spell from an account and an authority: refused
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       "AccountName=acct;AccountKey=k;BlobEndpoint=https://blobs.contoso.com")
    with pytest.raises(ConfigurationError, match="cannot reach the Blob endpoint"):
        IcebergSink("db.orders", catalog=properties)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",  # the same endpoint, respelled
                       "AccountName=acct;AccountKey=k;BlobEndpoint=HTTPS://ACCT.blob.core.windows.net/")
    IcebergSink("db.orders", catalog=properties)
    # pyiceberg 0.12 hands Arrow "container@account.../path"; the container's path here
    assert SparkeosFileIO.parse_location("abfss://lake@acct.dfs.core.windows.net/wh/t") == (
        "abfss", "lake@acct.dfs.core.windows.net", "lake/wh/t")


def test_a_warehouse_store_that_cannot_be_reached_is_said_as_such(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not "cast the column": the table's metadata could not be written, and the fix
    names the endpoint settings. A type Iceberg lacks still says to cast it."""
    import socket

    from sparkeos.core.errors import RetriableError

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    unreachable = {**catalog(tmp_path), "warehouse": "s3a://lake/wh",
                   "s3.endpoint": f"http://127.0.0.1:{port}", "s3.region": "us-east-1",
                   "s3.connect-timeout": "1"}
    with pytest.raises(RetriableError, match="writing its metadata failed") as caught:
        IcebergSink("db.orders", catalog=unreachable).validate(SCHEMA)
    assert "s3.endpoint" in (caught.value.fix or "")
    with pytest.raises(ConfigurationError, match="cast the column"):
        IcebergSink("db.spans", catalog=catalog(tmp_path)).validate(
            pa.schema([("d", pa.duration("s"))]))
