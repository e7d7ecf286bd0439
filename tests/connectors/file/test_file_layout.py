"""Partitioned output: the layout of Spark's partitionBy, through the file sink's calls."""

from __future__ import annotations

import datetime
import decimal
import os

import pyarrow as pa
import pytest

from sparkeos.connectors.file import FileSink, committed_files, read_output
from sparkeos.connectors.file.layout import (
    DEFAULT_PARTITION,
    directories,
    escape_path_name,
    normalise_columns,
    split,
    unescape_path_name,
)
from sparkeos.connectors.file.publish import publish
from sparkeos.connectors.file.sink import STAGING_DIR
from sparkeos.core.errors import ConfigurationError, SchemaMismatchError
from sparkeos.core.protocol import TxnState
from sparkeos.core.snapshot.txpool import TransactionPool

POOL = TransactionPool("q0", "files")
SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.date32()), ("country", pa.string())])


def rows(ids: list[int], days: list[int], countries: list[str | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"id": ids, "day": [datetime.date(2026, 11, d) for d in days],
         "country": countries}, schema=SCHEMA)


def test_values_are_escaped_as_spark_escapes_them() -> None:
    assert escape_path_name("a/b=c:d%e") == "a%2Fb%3Dc%3Ad%25e"
    assert escape_path_name("plain value-1.5") == "plain value-1.5"
    assert escape_path_name("tab\there") == "tab%09here"
    for text in ("a/b=c:d%e", "100%", "%zz", "x%4"):
        assert unescape_path_name(escape_path_name(text)) == text


def test_each_row_gets_its_directory_nulls_and_empties_the_default() -> None:
    batch = pa.RecordBatch.from_pydict({
        "s": ["x/y", None, ""], "n": [1, -2, None], "b": [True, False, True],
        "d": [decimal.Decimal("1.50"), decimal.Decimal("0"), None]},
        schema=pa.schema([("s", pa.string()), ("n", pa.int32()), ("b", pa.bool_()),
                          ("d", pa.decimal128(5, 2))]))
    assert directories(batch, ("s", "n", "b", "d")).to_pylist() == [
        "s=x%2Fy/n=1/b=true/d=1.50",
        f"s={DEFAULT_PARTITION}/n=-2/b=false/d=0.00",
        f"s={DEFAULT_PARTITION}/n={DEFAULT_PARTITION}/b=true/d={DEFAULT_PARTITION}"]


def test_split_keeps_each_directorys_rows_in_order_without_the_partition_columns() -> None:
    batch = rows([1, 2, 3, 4, 5], [26, 27, 26, 26, 27], ["DE", "FR", "DE", None, "FR"])
    parts = {d: b.to_pydict() for d, b in split(batch, ("day", "country"))}
    assert parts == {
        "day=2026-11-26/country=DE": {"id": [1, 3]},
        f"day=2026-11-26/country={DEFAULT_PARTITION}": {"id": [4]},
        "day=2026-11-27/country=FR": {"id": [2, 5]}}


def test_partition_columns_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="empty or repeated"):
        normalise_columns("day,,country")
    assert normalise_columns("day, country") == ("day", "country")
    sink = FileSink("/tmp/unused-layout", partition_by=["nope"])
    with pytest.raises(SchemaMismatchError, match="not in the batch"):
        sink.validate(SCHEMA)
    timestamps = pa.schema([("id", pa.int64()), ("at", pa.timestamp("us", "UTC"))])
    FileSink("/tmp/unused-layout", partition_by=["at"]).validate(timestamps)
    doubles = pa.schema([("id", pa.int64()), ("x", pa.float64())])
    with pytest.raises(ConfigurationError, match=r"Double.toString(.|\n)*cast\('string'\)"):
        FileSink("/tmp/unused-layout", partition_by=["x"]).validate(doubles)
    with pytest.raises(ConfigurationError, match="every column"):
        FileSink("/tmp/unused-layout", partition_by=["id", "day", "country"]).validate(SCHEMA)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_partitioned_commit_is_idempotent_and_lays_out_as_spark(tmp_path, fmt) -> None:
    sink = FileSink(str(tmp_path), format=fmt, partition_by=("day", "country"))
    sink.validate(SCHEMA)
    txn = POOL.transaction(0, 0, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, rows([1, 2], [26, 27], ["DE", "FR"]))
    sink.write(handle, rows([3], [26], ["DE"]))
    assert sink.probe(txn) is TxnState.OPEN
    receipt = sink.prepare(handle)
    assert receipt["dirs"] == ["day=2026-11-26/country=DE", "day=2026-11-27/country=FR"]
    assert committed_files(str(tmp_path), fmt) == []
    assert sink.probe(txn) is TxnState.PREPARED
    sink.commit(txn, receipt)
    sink.commit(txn, receipt)  # a replayed commit is a no-op
    assert sink.probe(txn) is TxnState.COMMITTED
    files = committed_files(str(tmp_path), fmt)
    assert [os.path.relpath(os.path.dirname(f), tmp_path) for f in files] == receipt["dirs"]
    table = read_output(str(tmp_path), fmt)
    assert sorted(zip(table.column("id").to_pylist(), table.column("day").to_pylist(),
                      table.column("country").to_pylist(), strict=True)) == [
        (1, "2026-11-26", "DE"), (2, "2026-11-27", "FR"), (3, "2026-11-26", "DE")]
    assert [n for n in os.listdir(tmp_path / STAGING_DIR) if not n.startswith(".")] == []


def test_a_commit_cut_between_two_directories_is_finished_by_the_next(tmp_path) -> None:
    """A commit killed after one directory's file moved: the twin (or the recovery)
    moves the others and finds the first in place."""
    sink = FileSink(str(tmp_path), partition_by=("country",))
    sink.validate(SCHEMA)
    txn = POOL.transaction(0, 0, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, rows([1, 2], [26, 26], ["DE", "FR"]))
    receipt = sink.prepare(handle)
    first_only = {**receipt, "dirs": receipt["dirs"][:1]}
    staging = str(tmp_path / STAGING_DIR / txn.txn_id)
    for directory in first_only["dirs"]:  # the first move, then the crash
        name = receipt["file"]
        os.makedirs(tmp_path / directory, exist_ok=True)
        os.link(os.path.join(staging, directory, name), tmp_path / directory / receipt["final"])
    publish(sink.files, txn, receipt, staging, str(tmp_path), fsync=True)
    assert sorted(read_output(str(tmp_path)).column("id").to_pylist()) == [1, 2]


def test_a_replay_with_the_same_rows_finds_its_files_other_rows_get_their_own(tmp_path):
    sink = FileSink(str(tmp_path), partition_by=("country",))
    sink.validate(SCHEMA)
    for attempt, ids in ((0, [1, 2]), (1, [1, 2]), (2, [1, 3])):
        txn = POOL.transaction(0, 0, attempt, 0)
        handle = sink.begin(txn)
        sink.write(handle, rows(ids, [26] * len(ids), ["DE", "FR"]))
        sink.commit(txn, sink.prepare(handle))
    assert sorted(read_output(str(tmp_path)).column("id").to_pylist()) == [1, 1, 2, 3]


def test_identity_names_the_layout_only_when_partitioned(tmp_path) -> None:
    assert "partition_by" not in FileSink(str(tmp_path)).identity()
    assert FileSink(str(tmp_path), partition_by="day").identity()["partition_by"] == ["day"]


def test_directories_of_a_leading_underscore_column_are_partitions(tmp_path) -> None:
    """Spark skips a ``_`` name only without an ``=``: the directories of a column
    ``_day`` hold committed files for every reader (the lost-checkpoint guard, probe,
    ``sparkeos status --probe``, ``read_output``); ``_temporary`` and ``_SUCCESS`` do
    not."""
    schema = pa.schema([("id", pa.int64()), ("_day", pa.date32())])
    sink = FileSink(str(tmp_path), partition_by=("_day",))
    sink.validate(schema)
    txn = POOL.transaction(0, 0, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, pa.RecordBatch.from_pydict(
        {"id": [1, 2], "_day": [datetime.date(2026, 11, 26), None]}, schema=schema))
    sink.commit(txn, sink.prepare(handle))
    os.makedirs(tmp_path / "_temporary" / "0")
    (tmp_path / "_temporary" / "0" / "part-x.snappy.parquet").write_bytes(b"")
    (tmp_path / "_SUCCESS").write_bytes(b"")
    assert [os.path.relpath(os.path.dirname(f), tmp_path)
            for f in committed_files(str(tmp_path))] == [
        "_day=2026-11-26", f"_day={DEFAULT_PARTITION}"]
    assert sink.probe(txn) is TxnState.COMMITTED
    table = read_output(str(tmp_path))
    assert sorted(zip(table.column("id").to_pylist(), table.column("_day").to_pylist(),
                      strict=True), key=str) == [(1, "2026-11-26"), (2, None)]
    assert "q0 (batches up to 0)" in (sink.output_of_other_queries("q1", "files") or "")
