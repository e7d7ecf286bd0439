"""``IcebergSink(merge_schema=True)`` (the format's ``mergeSchema``): a batch's new
columns added to the table before its tasks write, missing optional ones written as
null, widening where Iceberg allows, and what is refused (pyiceberg's SQL catalog on
SQLite, local paths; no Spark)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from sparkeos.connectors.iceberg import IcebergSink
from sparkeos.connectors.iceberg.format import IcebergFormat
from sparkeos.core.errors import SchemaMismatchError
from sparkeos.core.snapshot.txpool import TransactionPool

POOL = TransactionPool("q1", "orders")
FIRST = pa.schema([("id", pa.int64()), ("payload", pa.string())])


def catalog(tmp_path: Path) -> dict[str, str]:
    os.makedirs(tmp_path / "warehouse", exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": f"file://{tmp_path}/warehouse"}


def commit(sink: IcebergSink, batch_id: int, rows: pa.Table) -> None:
    sink.validate(rows.schema)  # the driver, before the batch
    txn = POOL.transaction(batch_id, 0, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, rows.to_batches()[0])
    sink.commit_merged([(txn, sink.prepare(handle))], recovering=False)


def test_new_columns_are_added_and_missing_ones_are_null(tmp_path: Path) -> None:
    sink = IcebergSink("db.orders", catalog=catalog(tmp_path), merge_schema=True)
    commit(sink, 0, pa.table({"id": [1], "payload": ["a"]}, schema=FIRST))
    commit(sink, 1, pa.table({"id": [2], "payload": ["b"], "amount": [2.5]}))
    commit(sink, 2, pa.table({"id": [3], "amount": [3.5]}))  # payload left out
    table = sink._load()
    assert [f.name for f in table.schema().fields] == ["id", "payload", "amount"]
    assert table.schema().find_field("amount").field_id == 3
    read = table.scan().to_arrow().sort_by("id").to_pylist()
    assert read == [{"id": 1, "payload": "a", "amount": None},
                    {"id": 2, "payload": "b", "amount": 2.5},
                    {"id": 3, "payload": None, "amount": 3.5}]
    assert table.scan(row_filter="amount > 3").to_arrow().column("id").to_pylist() == [3]


def test_a_column_is_widened_where_iceberg_allows(tmp_path: Path) -> None:
    sink = IcebergSink("db.orders", catalog=catalog(tmp_path), merge_schema=True)
    commit(sink, 0, pa.table({"id": pa.array([1], pa.int32()), "payload": ["a"]}))
    commit(sink, 1, pa.table({"id": pa.array([2**40], pa.int64()), "payload": ["b"]}))
    table = sink._load()
    assert str(table.schema().find_field("id").field_type) == "long"
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [1, 2**40]
    with pytest.raises(SchemaMismatchError, match="cannot add"):
        sink.validate(pa.schema([("id", pa.int64()), ("payload", pa.int64())]))


def test_without_merge_schema_other_columns_are_refused_with_the_fix(
        tmp_path: Path) -> None:
    sink = IcebergSink("db.orders", catalog=catalog(tmp_path))
    commit(sink, 0, pa.table({"id": [1], "payload": ["a"]}, schema=FIRST))
    with pytest.raises(SchemaMismatchError, match="merge_schema=True"):
        sink.validate(pa.schema([("id", pa.int64()), ("payload", pa.string()),
                                 ("amount", pa.float64())]))
    with pytest.raises(SchemaMismatchError, match="merge_schema=True"):
        sink.validate(pa.schema([("id", pa.int64())]))
    assert [f.name for f in sink._load().schema().fields] == ["id", "payload"]


def test_a_required_column_left_out_is_refused(tmp_path: Path) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    sink = IcebergSink("db.orders", catalog=catalog(tmp_path), merge_schema=True)
    sink._catalog().create_namespace_if_not_exists("db")
    sink._catalog().create_table("db.orders", schema=Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "payload", StringType(), required=False)))
    with pytest.raises(SchemaMismatchError, match="required"):
        sink.validate(pa.schema([("payload", pa.string())]))


def test_the_format_takes_merge_schema(tmp_path: Path) -> None:
    options = {"path": "db.orders", "checkpointLocation": str(tmp_path / "ckpt"),
               "mergeschema": "true",  # as Spark hands a Python format its keys
               **{f"sparkeos.catalog.{k}": v for k, v in catalog(tmp_path).items()}}
    sink, _ = IcebergFormat(options=options)._sink_and_settings(FIRST)
    assert isinstance(sink, IcebergSink) and sink.merge_schema


def test_a_batch_of_the_tables_own_schema_commits_no_metadata(tmp_path: Path) -> None:
    sink = IcebergSink("db.orders", catalog=catalog(tmp_path), merge_schema=True)
    commit(sink, 0, pa.table({"id": [1], "payload": ["a"]}, schema=FIRST))
    before = sink._load().metadata_location
    sink.validate(FIRST)
    sink.validate(pa.schema([("id", pa.int64())]))
    assert sink._load().metadata_location == before
