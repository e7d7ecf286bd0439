"""DeltaSink's protocol against a real Delta table (delta-rs), without Spark: partition
directories and values as delta-rs' own writer lays them out, the schema, the
at-least-once path, the lost-checkpoint record and what a rollback may delete."""

from __future__ import annotations

import datetime
import os
import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from sparkeos.connectors.delta import DeltaSink
from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import (
    AttemptFencedError,
    ConfigurationError,
    DataRejectedError,
    TransactionAbortedError,
)
from sparkeos.core.faults import ALL_POINTS
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.txpool import TransactionPool
from sparkeos.testing.inprocess import ArrowRunner, MemoryStore, crash_then_finish

POOL = TransactionPool("q1", "orders")


def batch(ids: list[int], days: list[datetime.date | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "id": pa.array(ids, pa.int64()), "payload": [f"p{i}" for i in ids],
        "day": pa.array(days, pa.date32())})


def prepared(sink: DeltaSink, batch_id: int, partition: int, rows: pa.RecordBatch,
             pool: TransactionPool = POOL) -> tuple[object, dict[str, object]]:
    txn = pool.transaction(batch_id, partition, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, rows)
    return txn, sink.prepare(handle)


def test_a_partitioned_batch_is_one_commit_laid_out_as_delta_rs_lays_it_out(
        tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "ours"), partition_by=("day",))
    days = [datetime.date(2026, 11, 27), datetime.date(2026, 11, 28), None]
    items = [prepared(sink, 0, 0, batch([1, 2, 3], days)),
             prepared(sink, 0, 1, batch([4], [days[1]]))]
    sink.commit_merged(items, recovering=False)  # type: ignore[arg-type]
    sink.commit_merged(items, recovering=True)  # type: ignore[arg-type]  # a twin: no-op
    ours = DeltaTable(str(tmp_path / "ours"))
    assert ours.version() == 1 and ours.transaction_version("sparkeos.q1.orders") == 0
    theirs_path = str(tmp_path / "theirs")
    write_deltalake(theirs_path, pa.Table.from_batches([batch([1, 2, 3, 4], [*days, days[1]])]),
                    partition_by=["day"])
    theirs = DeltaTable(theirs_path)
    assert ours.schema().to_arrow() == theirs.schema().to_arrow()
    assert sorted(ours.to_pyarrow_table().sort_by("id").to_pylist(), key=str) == \
        sorted(theirs.to_pyarrow_table().sort_by("id").to_pylist(), key=str)

    def directories(root: str) -> set[str]:
        return {d for d in os.listdir(root) if not d.startswith("_")}

    assert directories(str(tmp_path / "ours")) == directories(theirs_path)
    assert {str(k): v for k, v in ours.partitions()[0].items()} in [
        {str(k): v for k, v in p.items()} for p in theirs.partitions()]


def test_a_rollback_deletes_only_what_no_commit_references(tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "t"))
    committed = prepared(sink, 0, 0, batch([1], [None]))
    sink.commit_merged([committed], recovering=False)  # type: ignore[list-item]
    sink.rollback(committed[0])  # type: ignore[arg-type]  # never for a decided ID; harmless
    left = prepared(sink, 1, 0, batch([2], [None]))
    sink.rollback(left[0])  # type: ignore[arg-type]
    table = DeltaTable(str(tmp_path / "t"))
    assert table.to_pyarrow_table().column("id").to_pylist() == [1]
    parquet = [n for n in os.listdir(tmp_path / "t") if n.endswith(".parquet")]
    assert len(parquet) == 1 and not os.listdir(tmp_path / "t" / "_sparkeos" / "attempts")


def test_at_least_once_commits_each_participant_and_other_queries_are_found(
        tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "t"))
    per_task = sink.for_guarantee(Guarantee.AT_LEAST_ONCE)
    for partition in (0, 1):
        txn, receipt = prepared(per_task, 0, partition, batch([partition], [None]))
        per_task.commit(txn, receipt)  # type: ignore[arg-type]
    assert sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table().column("id").to_pylist()) \
        == [0, 1]
    sink.commit_merged([prepared(sink, 1, 0, batch([2], [None]))],  # type: ignore[list-item]
                       recovering=False)
    assert sink.output_of_other_queries("q1", "orders") is None
    assert "q1" in (sink.output_of_other_queries("q2", "orders") or "")


def test_other_queries_are_found_in_the_log_when_the_records_beside_it_are_gone(
        tmp_path: Path) -> None:
    """A copy of the table without ``_sparkeos/`` (the records of which queries wrote
    it): the commits' own ``commitInfo`` still names the query, read from the log."""
    import shutil

    sink = DeltaSink(str(tmp_path / "t"))
    sink.commit_merged([prepared(sink, 0, 0, batch([1], [None]))],  # type: ignore[list-item]
                       recovering=False)
    shutil.rmtree(tmp_path / "t" / "_sparkeos")
    assert "q1" in (sink.output_of_other_queries("q2", "orders") or "")
    assert sink.output_of_other_queries("q2", "another-sink") is None


def test_what_the_sink_cannot_do_is_refused_up_front(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="local paths, S3, Azure Blob Storage and HDFS"):
        DeltaSink("gs://bucket/orders")
    with pytest.raises(ConfigurationError, match="RPC port"):
        DeltaSink("webhdfs://namenode:9870/orders")
    sink = DeltaSink(str(tmp_path / "t"), partition_by=("amount",))
    with pytest.raises(ConfigurationError, match="partitions by"):
        sink.validate(pa.schema([("id", pa.int64()), ("amount", pa.float64())]))
    with pytest.raises(ConfigurationError, match="not a column"):
        DeltaSink(str(tmp_path / "t"), partition_by=("day",)).validate(
            pa.schema([("id", pa.int64())]))
    with pytest.raises(ConfigurationError, match="key column 'day' is not a column"):
        DeltaSink(str(tmp_path / "t"), key=("day",)).validate(pa.schema([("id", pa.int64())]))
    with pytest.raises(ConfigurationError, match="plain values"):
        DeltaSink(str(tmp_path / "t"), key=("k",)).validate(
            pa.schema([("k", pa.list_(pa.int64())), ("n", pa.int64())]))


def test_delta_rs_is_given_the_azure_table_the_sinks_files_resolved(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One resolution on the driver: the endpoint of the connection string's account
    travels with the sink, delta-rs gets the table as ``az://`` (it reads no ``wasb``),
    and the key or SAS token of the process that calls it, never kept in the sink."""
    from sparkeos.connectors.delta.stores import storage_options, table_uri, with_credentials

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       "AccountName=acct;AccountKey=s3cr3t;BlobEndpoint=http://127.0.0.1:1/acct")
    for uri in ("abfss://lake@acct.dfs.core.windows.net/t/orders",
                "wasbs://lake@acct.blob.core.windows.net/t/orders"):
        sink = DeltaSink(uri)
        assert table_uri(sink.where) == "az://lake/t/orders"
        options = storage_options(sink.where)
        assert options == {"azure_storage_account_name": "acct",
                           "azure_storage_endpoint": "http://127.0.0.1:1/acct",
                           "azure_storage_use_emulator": "false",  # it would win
                           "azure_allow_http": "true"}
        assert sink.identity() == {"path": "azure://acct/lake/t/orders"}  # one spelling
        assert "s3cr3t" not in repr(sink.__dict__)
        assert with_credentials(sink.where, options) == {
            **options, "azure_storage_account_key": "s3cr3t"}
    assert DeltaSink("abfss://lake@ACCT.dfs.core.windows.net/t/orders").identity() == {
        "path": "azure://acct/lake/t/orders"}
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=other;AccountKey=x")
    monkeypatch.setenv("AZURE_STORAGE_SAS_TOKEN", "?sv=1&sig=2")
    sink = DeltaSink("abfss://lake@acct.dfs.core.windows.net/orders")
    options = storage_options(sink.where)
    assert options is not None
    assert options["azure_storage_endpoint"] == "https://acct.blob.core.windows.net"
    assert "azure_allow_http" not in options
    assert with_credentials(sink.where, options)["azure_storage_sas_token"] == "sv=1&sig=2"  # type: ignore[index]


def test_delta_rs_reaches_hdfs_only_as_the_user_sparkeos_writes_as(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """hdfs-native picks its user in each process; sparkeos' WebHDFS user is the
    driver's. Two owners of one table would each leave the other unable to write:
    refused before delta-rs is called, with the fix."""
    from sparkeos.connectors.delta.stores import storage_options

    monkeypatch.setenv("HADOOP_USER_NAME", "etl")
    sink = DeltaSink("hdfs://NameNode:8020/tables/orders")
    assert storage_options(sink.where) is None
    assert sink.identity() == {"path": "hdfs://namenode:8020/tables/orders"}
    assert DeltaSink("hdfs://namenode/tables/orders").identity() == sink.identity()
    monkeypatch.setenv("HADOOP_USER_NAME", "someone-else")
    with pytest.raises(ConfigurationError, match="HADOOP_USER_NAME=etl"):
        storage_options(sink.where)
    monkeypatch.setenv("HADOOP_USER_NAME", "")  # hdfs-native takes it as it is
    with pytest.raises(ConfigurationError, match="as ''"):
        storage_options(sink.where)


def test_a_store_clients_secret_is_never_in_an_error() -> None:
    """Azure's clients (azure-core, Arrow's) quote the request's URL, SAS and all; every
    sparkeos error masks it, whichever connector wraps the client's message."""
    from sparkeos.core.errors import RetriableError

    error = RetriableError("Max retries exceeded with url: /c/blob?sv=2024&se=x&"
                           "sig=AbC%2Fd123&sp=rw; AccountKey=s3cr3t==;BlobEndpoint=x")
    assert "AbC" not in str(error) and "sig=***&sp=rw" in str(error)
    assert "s3cr3t" not in str(error) and "AccountKey=***;" in str(error)
    assert "AbC" not in str(pickle.loads(pickle.dumps(error)))


def words(**counts: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"word": pa.array(list(counts), pa.string()),
                                       "n": pa.array(list(counts.values()), pa.int64())})


WORD_BATCHES = [[words(a=1, b=1), words(c=1)], [words(b=2), words()],
                [words(a=2), words(c=3, d=1)]]


@pytest.mark.parametrize("point", ALL_POINTS)
def test_upsert_by_key_under_a_crash_at_every_point(tmp_path: Path, point: str) -> None:
    """Update-mode counts MERGEd by key, each batch once, through the coordinator with
    a crash at every protocol point of batch 1 and a restart."""
    sink = DeltaSink(str(tmp_path / "wc"), key=("word",))
    assert sink.cluster_by() == ("word",)
    log = CommitLog(MemoryStore())
    crash_then_finish(lambda faults: Coordinator(sink, CoordinatorConfig(name="wc"), log,
                                                 "qtest", faults),
                      WORD_BATCHES, point, ArrowRunner)
    rows = DeltaTable(str(tmp_path / "wc")).to_pyarrow_table().to_pylist()
    assert {r["word"]: r["n"] for r in rows} == {"a": 2, "b": 2, "c": 3, "d": 1}
    assert len(rows) == 4
    staging = tmp_path / "wc" / "_sparkeos" / "staging"
    assert not any(staging.rglob("*.parquet")) if staging.exists() else True


def test_a_key_repeated_in_a_batch_is_refused(tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "wc"), key="word")
    coord = Coordinator(sink, CoordinatorConfig(name="wc"), CommitLog(MemoryStore()), "q")
    repeated = pa.RecordBatch.from_pydict({"word": ["a", "a"], "n": [1, 2]})
    with pytest.raises((DataRejectedError, TransactionAbortedError), match="twice"):
        coord.run_batch(0, ArrowRunner([repeated]))
    assert not DeltaTable.is_deltatable(str(tmp_path / "wc"))


def test_a_late_twin_of_an_older_upsert_batch_changes_nothing(tmp_path: Path) -> None:
    """Batch 1 set a=5, batch 2 a=7; a twin committer of batch 1 that comes late (its
    reply was lost) must not bring a=5 back: the app version keeps each batch to one
    MERGE."""
    sink = DeltaSink(str(tmp_path / "wc"), key=("word",))
    late = prepared(sink, 1, 0, words(a=5))
    late_copy = (late[0], dict(late[1]))
    sink.commit_merged([late], recovering=False)  # type: ignore[list-item]
    sink.commit_merged([prepared(sink, 2, 0, words(a=7))],  # type: ignore[list-item]
                       recovering=False)
    sink.commit_merged([late_copy], recovering=True)  # type: ignore[list-item]
    assert DeltaTable(str(tmp_path / "wc")).to_pyarrow_table().to_pylist() == [
        {"word": "a", "n": 7}]


def test_a_batch_of_one_participant_commits_once_and_records_its_query(
        tmp_path: Path) -> None:
    """Exactly-once with one participant: the coordinator calls commit / recover_commit,
    which are the merged commit of one (app version, query record); a zombie of the
    committed attempt ID cannot replace its file."""
    sink = DeltaSink(str(tmp_path / "t"))
    txn, receipt = prepared(sink, 0, 0, batch([1], [None]))
    sink.commit(txn, receipt)  # type: ignore[arg-type]
    sink.recover_commit(txn, receipt)  # type: ignore[arg-type]
    table = DeltaTable(str(tmp_path / "t"))
    assert table.transaction_version("sparkeos.q1.orders") == 0 and table.version() == 1
    assert "q1" in (sink.output_of_other_queries("q2", "orders") or "")
    with pytest.raises(AttemptFencedError):  # the same ID again, after its commit
        prepared(sink, 0, 0, batch([9], [None]))
    assert DeltaTable(str(tmp_path / "t")).to_pyarrow_table().column("id").to_pylist() == [1]


def test_an_empty_upsert_batch_and_a_null_key(tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "wc"), key=("word",))
    none = pa.RecordBatch.from_pydict({"word": pa.array([None, "a"], pa.string()),
                                       "n": pa.array([1, 1], pa.int64())})
    for batch_id, rows in enumerate([none, words(), none]):
        txn = POOL.transaction(batch_id, 0, 0, 0)
        handle = sink.begin(txn)
        sink.write(handle, rows)
        sink.commit(txn, sink.prepare(handle))
    rows = DeltaTable(str(tmp_path / "wc")).to_pyarrow_table().to_pylist()
    assert sorted(rows, key=str) == sorted([{"word": None, "n": 1}, {"word": "a", "n": 1}],
                                           key=str)


def test_an_upsert_whose_twin_merges_between_its_check_and_its_read_is_done(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sparkeos recover`` beside the driver: the twin merges the batch and deletes its
    staged rows after this committer found them there and before it read them. The
    batch is done, once; no error."""
    from sparkeos.connectors.delta import sink as sink_module

    sink = DeltaSink(str(tmp_path / "wc"), key=("word",))
    item = prepared(sink, 0, 0, words(a=5))
    twin_item = (item[0], dict(item[1]))
    real_merge = sink_module.table.merge_batch

    def twin_first(*args: object, **kwargs: object) -> bool:
        monkeypatch.setattr(sink_module.table, "merge_batch", real_merge)
        DeltaSink(str(tmp_path / "wc"), key=("word",)).commit_merged(
            [twin_item], recovering=True)  # type: ignore[list-item]
        return real_merge(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sink_module.table, "merge_batch", twin_first)
    sink.commit_merged([item], recovering=False)  # type: ignore[list-item]
    assert DeltaTable(str(tmp_path / "wc")).to_pyarrow_table().to_pylist() == [
        {"word": "a", "n": 5}]


def test_an_attempts_rows_make_one_file_per_partition(tmp_path: Path) -> None:
    """Spark hands a task its rows in Arrow batches: they are held until a file's worth
    (``core/rowbuffer.py``) or prepare, not written as a file each."""
    sink = DeltaSink(str(tmp_path / "t"), partition_by=("day",))
    days = [datetime.date(2026, 11, 27), datetime.date(2026, 11, 28)]
    txn = POOL.transaction(0, 0, 0, 0)
    handle = sink.begin(txn)
    for start in (0, 10, 20):
        sink.write(handle, batch(list(range(start, start + 10)), [days[i % 2] for i in
                                                                range(10)]))
    sink.commit_merged([(txn, sink.prepare(handle))], recovering=False)  # type: ignore[list-item]
    table = DeltaTable(str(tmp_path / "t"))
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(30))
    assert len(table.file_uris()) == 2
