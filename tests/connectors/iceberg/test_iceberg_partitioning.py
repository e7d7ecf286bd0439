"""IcebergSink on partitioned tables (pyiceberg's SQL catalog on SQLite, local paths; no
Spark): the spec ``partition_by`` names or the table's own, files under their partition's
path with the partition record phase 1 computed, the same data files as pyiceberg's own
append of the same rows (generated: partition records, paths, rows, Parquet physical
schema), NaN kept, a crash at every protocol point, and what
is refused up front or when the spec changes under a decided batch."""

from __future__ import annotations

import datetime
import decimal
import math
import os
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyiceberg.types import StringType

from sparkeos.connectors.iceberg import IcebergSink
from sparkeos.connectors.iceberg import partitioning as parts
from sparkeos.connectors.iceberg.format import IcebergFormat
from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import ConfigurationError, SchemaMismatchError
from sparkeos.core.faults import ALL_POINTS
from sparkeos.core.protocol import Receipt, Transaction
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.txpool import TransactionPool
from sparkeos.testing.inprocess import ArrowRunner, MemoryStore, crash_then_finish
from tests.support.generated_tables import draw_table

POOL = TransactionPool("q1", "events")
SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()),
                    ("at", pa.timestamp("us", tz="UTC")), ("score", pa.float64())])
START = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)


def catalog(tmp_path: Path) -> dict[str, str]:
    os.makedirs(tmp_path / "warehouse", exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
            "warehouse": f"file://{tmp_path}/warehouse"}


def make_sink(tmp_path: Path, partition_by: Any = ("region", "days(at)"),
              schema: pa.Schema = SCHEMA, **options: Any) -> IcebergSink:
    sink = IcebergSink("db.events", catalog=catalog(tmp_path), partition_by=partition_by,
                       **options)
    sink.validate(schema)
    return sink


def events(ids: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "id": pa.array(ids, pa.int64()),
        "region": [("eu", "us", None)[i % 3] for i in ids],
        "at": pa.array([START + datetime.timedelta(hours=13 * i) for i in ids],
                       pa.timestamp("us", tz="UTC")),
        "score": [float(i) for i in ids]})


def prepared(sink: IcebergSink, batch_id: int, partition: int,
             batch: pa.RecordBatch) -> tuple[Transaction, Receipt]:
    txn = POOL.transaction(batch_id, partition, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, batch)
    return txn, sink.prepare(handle)


def entries(table: Any) -> list[tuple[tuple[Any, ...], int, str]]:
    """The current snapshot's data files: (partition values, rows, path under data/)."""
    found = []
    for task in table.scan().plan_files():
        values = tuple(task.file.partition[i] for i in range(len(table.spec().fields)))
        relative = task.file.file_path.split("/data/", 1)[1]
        found.append((values, task.file.record_count, os.path.dirname(relative)))
    return sorted(found, key=repr)


def test_spellings_of_partition_by() -> None:
    parsed = parts.parse(["region", "days(at)", "bucket(16, id)", "truncate(4,name)",
                          "hours(t)", "YEARS(y)", "months(m)"])
    assert [(p.source, p.transform, p.name) for p in parsed] == [
        ("region", "identity", "region"), ("at", "day", "at_day"),
        ("id", "bucket[16]", "id_bucket"), ("name", "truncate[4]", "name_trunc"),
        ("t", "hour", "t_hour"), ("y", "year", "y_year"), ("m", "month", "m_month")]
    assert [p.shown() for p in parsed[:3]] == ["region", "day(at)", "bucket(16, id)"]
    assert parts.split_option("region, bucket(16, id) ,days(at)") == (
        "region", "bucket(16, id)", "days(at)")
    for bad, said in [("bucket(id)", "not an Iceberg transform"),
                      ("days(3, at)", "not an Iceberg transform"),
                      ("zorder(id)", "not an Iceberg transform"),
                      ("bucket(0, id)", "positive"), ("a b", "neither a column"),
                      ("", "not a column")]:
        with pytest.raises(ConfigurationError, match=said):
            parts.parse([bad])
    with pytest.raises(ConfigurationError, match="one column twice"):
        parts.parse(["id", "bucket(4, id)"])


def test_a_batch_lands_in_its_partitions_once(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    items = [prepared(sink, 0, 0, events([0, 1, 2, 3])), prepared(sink, 0, 1, events([4]))]
    sink.commit_merged(items, recovering=False)
    sink.commit_merged(items, recovering=True)  # a twin: nothing again
    table = sink._load()
    assert [(f.name, str(f.transform)) for f in table.spec().fields] == [
        ("region", "identity"), ("at_day", "day")]
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [0, 1, 2, 3, 4]
    assert len(table.snapshots()) == 1
    found = entries(table)
    assert ("region=eu/at_day=2026-12-01") in {path for _, _, path in found}
    assert ("region=null/at_day=2026-12-02") in {path for _, _, path in found}
    assert sum(rows for _, rows, _ in found) == 5
    eu = table.scan(row_filter="region == 'eu'").to_arrow().column("id").to_pylist()
    assert sorted(eu) == [0, 3]


@pytest.mark.parametrize("file_bytes", [64 * 1024 * 1024, 1])
def test_an_attempts_rows_make_a_file_per_partition_and_file_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_bytes: int) -> None:
    """Spark hands a task its rows in Arrow batches: they are held until a file's worth
    (``core/rowbuffer.py``), not written as a file each."""
    from sparkeos.core import rowbuffer

    monkeypatch.setattr(rowbuffer, "FILE_BYTES", file_bytes)
    sink = make_sink(tmp_path, partition_by=("region",))
    txn = POOL.transaction(0, 0, 0, 0)
    handle = sink.begin(txn)
    for start in range(0, 30, 10):
        sink.write(handle, events(list(range(start, start + 10))))
    sink.commit_merged([(txn, sink.prepare(handle))], recovering=False)
    table = sink._load()
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(30))
    assert len(entries(table)) == (3 if file_bytes > 1 else 9)  # 3 regions, 3 writes


def test_the_sink_follows_the_tables_own_spec(tmp_path: Path) -> None:
    """Iceberg's hidden partitioning: without partition_by the sink writes as the table
    is partitioned (here by a bucket of the id, made by another tool)."""
    from pyiceberg.transforms import BucketTransform

    made = IcebergSink("db.events", catalog=catalog(tmp_path))
    made._catalog().create_namespace_if_not_exists("db")
    table = made._catalog().create_table("db.events", schema=SCHEMA)
    with table.update_spec() as update:
        update.add_field("id", BucketTransform(4), "id_bucket")
    sink = make_sink(tmp_path, partition_by=())
    sink.commit_merged([prepared(sink, 0, 0, events(list(range(12))))], recovering=False)
    found = entries(sink._load())
    assert len(found) > 1 and {path.split("=")[0] for _, _, path in found} == {"id_bucket"}
    with pytest.raises(ConfigurationError, match=r"partition_by=\('bucket\(4, id\)',\)"):
        make_sink(tmp_path, partition_by=("region",))


@pytest.mark.parametrize("point", ALL_POINTS)
def test_a_crash_at_every_protocol_point_then_a_restart(tmp_path: Path, point: str) -> None:
    sink = make_sink(tmp_path)
    log = CommitLog(MemoryStore())
    batches = [[events([0, 1, 2]), events([3])], [events([4, 5]), events([6, 7, 8])]]
    crash_then_finish(lambda faults: Coordinator(sink, CoordinatorConfig(name="events"),
                                                 log, "qtest", faults),
                      batches, point, runner=lambda rows: ArrowRunner(rows, schema=SCHEMA))
    table = sink._load()
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(9))
    assert len(table.snapshots()) == 2
    assert on_disk(tmp_path) == referenced(table)  # a rollback left none, deleted none


def test_nan_in_a_float_partition_is_kept(tmp_path: Path) -> None:
    """pyiceberg's own append of these rows fails (it splits by ``==``, which NaN never
    is); the sink groups NaN with NaN."""
    sink = make_sink(tmp_path, partition_by=("score",))
    other_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    batch = pa.RecordBatch.from_pydict({
        "id": [1, 2, 3, 4, 5, 6, 7, 8], "region": ["eu"] * 8,
        "at": pa.array([START] * 8, pa.timestamp("us", tz="UTC")),
        "score": [math.nan, -math.nan, None, 1.5, other_nan, 0.0, -0.0, math.inf]})
    sink.commit_merged([prepared(sink, 0, 0, batch)], recovering=False)
    table = sink._load()
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == list(range(1, 9))
    nan_files = [rows for values, rows, _ in entries(table)
                 if isinstance(values[0], float) and math.isnan(values[0])]
    assert nan_files == [3]  # one group, whatever a NaN's bits
    # 0.0 and -0.0 are two partitions, as Java's Iceberg keeps them (pyiceberg's own
    # append writes each row of either into both)
    zeros = sorted(str(values[0]) for values, _, _ in entries(table) if values[0] == 0.0)
    assert zeros == ["-0.0", "0.0"]
    with pytest.raises(ConfigurationError, match="cannot put a NaN"):
        IcebergSink("db.events", catalog=catalog(tmp_path), key=("id",)).validate(SCHEMA)


def test_a_batch_written_under_two_specs_commits_in_the_tables_spec(tmp_path: Path) -> None:
    """Another writer evolves the partitioning between the batch's two tasks and again
    before its commit: the commit rewrites every file of another spec into the table's,
    deletes the originals, and a filtered read finds every row."""
    sink = make_sink(tmp_path)
    first = prepared(sink, 0, 0, events([0, 1, 2]))
    with sink._load().update_spec() as update:
        update.add_identity("score")
    second = prepared(sink, 0, 1, events([3, 4]))
    with sink._load().update_spec() as update:
        update.remove_field("region")
    sink.commit_merged([first, second], recovering=False)
    sink.commit_merged([first, second], recovering=True)  # a twin: nothing again
    table = sink._load()
    assert {task.file.spec_id for task in table.scan().plan_files()} == {table.spec().spec_id}
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [0, 1, 2, 3, 4]
    for i in range(5):
        assert table.scan(row_filter=f"score == {float(i)}").to_arrow() \
            .column("id").to_pylist() == [i]
    assert on_disk(tmp_path) == referenced(table)  # the originals deleted


def test_a_spec_changed_while_the_commit_retries_is_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The spec changes, and another writer commits, after the committer loaded the
    table: pyiceberg's own retry would put the files in a manifest of the new spec with
    the old partition records (filtered reads would miss rows); the commit builds them
    again for the new spec."""
    from pyiceberg.transforms import BucketTransform

    sink = make_sink(tmp_path, partition_by=("bucket(4, id)",))
    items = [prepared(sink, 0, 0, events(list(range(20))))]
    other = IcebergSink("db.events", catalog=catalog(tmp_path))
    original = IcebergSink._load
    calls: list[int] = []

    def load(self: IcebergSink) -> Any:
        found = original(self)
        if not calls:
            calls.append(1)
            with other._load().update_spec() as update:
                update.remove_field("id_bucket")
                update.add_field("id", BucketTransform(8), "id_bucket_8")
            other._load().append(pa.Table.from_batches([events([100])]).cast(
                other._load().scan().to_arrow().schema))
        return found

    monkeypatch.setattr(IcebergSink, "_load", load)
    sink.commit_merged(items, recovering=False)
    monkeypatch.undo()
    table = sink._load()
    assert calls and sorted(table.scan().to_arrow().column("id").to_pylist()) == [
        *range(20), 100]
    for i in range(20):
        assert table.scan(row_filter=f"id == {i}").to_arrow().column("id").to_pylist() == [i]
    assert on_disk(tmp_path) == referenced(table)


def on_disk(tmp_path: Path) -> set[str]:
    return {str(p) for p in (tmp_path / "warehouse").rglob("*.parquet")}


def referenced(table: Any) -> set[str]:
    return {task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()}


def test_what_cannot_be_partitioned_is_refused_up_front(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not a column of the batch"):
        make_sink(tmp_path, partition_by=("days(when)",))
    make_sink(tmp_path)
    with pytest.raises(ConfigurationError, match="partitioned by \\['region', 'day\\(at\\)'\\]"):
        make_sink(tmp_path, partition_by=("region",))
    other = IcebergSink("db.other", catalog=catalog(tmp_path), partition_by=("bucket(4, score)",))
    with pytest.raises(ConfigurationError, match="change partition_by"):
        other.validate(SCHEMA)  # Iceberg buckets no floats
    assert other._load() is None  # nothing made
    from pyiceberg.transforms import BucketTransform

    twice = other._catalog().create_table("db.twice", schema=SCHEMA)
    with twice.update_spec() as update:
        update.add_identity("id")
        update.add_field("id", BucketTransform(4), "id_bucket")
    with pytest.raises(ConfigurationError, match="two transforms of one column"):
        IcebergSink("db.twice", catalog=catalog(tmp_path)).validate(SCHEMA)


def test_an_upsert_into_a_partitioned_table(tmp_path: Path) -> None:
    sink = make_sink(tmp_path, partition_by=("bucket(4, id)", "region"), key=("id",))
    sink.commit_merged([prepared(sink, 0, 0, events([0, 1, 2]))], recovering=False)
    changed = events([1, 2]).to_pydict()
    changed["score"] = [10.0, 20.0]
    sink.commit_merged([prepared(sink, 1, 0, pa.RecordBatch.from_pydict(
        changed, schema=SCHEMA))], recovering=False)
    read = sink._load().scan().to_arrow().sort_by("id")
    assert read.column("id").to_pylist() == [0, 1, 2]
    assert read.column("score").to_pylist() == [0.0, 10.0, 20.0]


def test_the_format_takes_partition_by(tmp_path: Path) -> None:
    options = {"path": "db.events", "checkpointLocation": str(tmp_path / "ckpt"),
               "sparkeos.partitionBy": "region, bucket(8, id)",
               **{f"sparkeos.catalog.{k}": v for k, v in catalog(tmp_path).items()}}
    sink, _ = IcebergFormat(options=options)._sink_and_settings(SCHEMA)
    assert isinstance(sink, IcebergSink)
    assert sink.partition_by == ("region", "bucket(8, id)")
    assert IcebergSink.from_description(sink.describe()) == sink  # `sparkeos recover`


# The same data files as pyiceberg's own append, on generated rows and specs.
KINDS = {
    "i": (pa.int32(), st.integers(-2**31, 2**31 - 1)),
    "l": (pa.int64(), st.integers(-2**63, 2**63 - 1)),
    "s": (pa.string(), st.text(max_size=30)),
    "b": (pa.bool_(), st.booleans()),
    "d": (pa.date32(), st.dates(datetime.date(1900, 1, 1), datetime.date(2200, 1, 1))),
    "t": (pa.timestamp("us", tz="UTC"), st.datetimes(
        datetime.datetime(1900, 1, 1), datetime.datetime(2200, 1, 1),
        timezones=st.just(datetime.timezone.utc))),
    "m": (pa.decimal128(9, 2), st.decimals(-10**6, 10**6, places=2, allow_nan=False,
                                           allow_infinity=False)),
    "x": (pa.binary(), st.binary(max_size=20)),
    "g": (pa.float64(), st.floats()),
    "n": (pa.timestamp("us"), st.datetimes(datetime.datetime(1900, 1, 1),
                                           datetime.datetime(2200, 1, 1))),
}
TRANSFORMS = {"i": ["{}", "bucket(3, {})", "truncate(10, {})"],
              "l": ["{}", "bucket(5, {})", "truncate(100, {})"],
              "s": ["{}", "bucket(4, {})", "truncate(2, {})"], "b": ["{}"],
              "d": ["{}", "years({})", "months({})", "days({})"],
              "t": ["{}", "years({})", "months({})", "days({})", "hours({})"],
              "m": ["{}", "bucket(4, {})", "truncate(50, {})"], "x": ["{}", "bucket(2, {})"],
              "g": [""], "n": ["{}", "days({})", ""]}
"""Each column's partition transforms ("": not partitioned by it; a float's NaN would fail
pyiceberg's own append, the comparison's other side)."""


@st.composite
def partitioned_rows(draw: Any) -> tuple[pa.Table, tuple[str, ...]]:
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=3,
                          unique=True))
    rows = draw_table(draw, kinds, KINDS, draw(st.integers(1, 12)))
    spec = tuple(entry for entry in (draw(st.sampled_from(TRANSFORMS[k])).format(f"c{k}")
                                     for k in kinds) if entry)
    return rows, spec


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(partitioned_rows())
def test_the_same_data_files_as_pyicebergs_own_append(
        tmp_path_factory: pytest.TempPathFactory, case: tuple[pa.Table, tuple[str, ...]]) -> None:
    rows, spec = case
    tmp_path = tmp_path_factory.mktemp("generated")
    sink = make_sink(tmp_path, partition_by=spec, schema=rows.schema)
    half = rows.num_rows // 2

    def batch(part: pa.Table) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict(part.to_pydict(), schema=part.schema)

    sink.commit_merged([prepared(sink, 0, 0, batch(rows.slice(0, half))),
                        prepared(sink, 0, 1, batch(rows.slice(half)))], recovering=False)
    ours = sink._load()
    theirs = IcebergSink("db.theirs", catalog=catalog(tmp_path), partition_by=spec)
    theirs.validate(rows.schema)
    theirs._load().append(rows.cast(pa.schema(
        [f.remove_metadata() for f in ours.scan().to_arrow().schema])))
    mine, pyicebergs = entries(ours), entries(theirs._load())

    def by_partition(found: list[tuple[tuple[Any, ...], int, str]]) -> dict[Any, Any]:
        totals: dict[Any, Any] = {}
        for values, count, path in found:
            kept = totals.setdefault(repr(values), [0, set()])
            kept[0] += count
            kept[1].add(path)
        return totals

    assert by_partition(mine) == by_partition(pyicebergs)
    assert ours.schema() == theirs._load().schema() and ours.spec() == theirs._load().spec()
    read_ours = ours.scan().to_arrow().sort_by("id")
    read_theirs = theirs._load().scan().to_arrow().sort_by("id")
    assert repr(read_ours.to_pylist()) == repr(read_theirs.to_pylist())  # NaN == NaN
    assert read_ours.schema == read_theirs.schema
    assert physical_schema(ours) == physical_schema(theirs._load())


def physical_schema(table: Any) -> str:
    """A data file's Parquet schema, its columns (the root group's name is the writer's)."""
    import pyarrow.parquet as pq

    first = next(iter(table.scan().plan_files())).file.file_path.removeprefix("file://")
    return str(pq.ParquetFile(first).schema).split("\n", 2)[2]


def test_decimal_partition_values_round_trip() -> None:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import IdentityTransform
    from pyiceberg.types import DecimalType, NestedField

    schema = Schema(NestedField(1, "m", DecimalType(9, 2), required=False))
    spec = PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "m"))
    split = parts.split(pa.table({"m": pa.array([decimal.Decimal("-1.25"), None],
                                                pa.decimal128(9, 2))}), spec, schema)
    for part in split:
        assert parts.decode(parts.encode(part.key), spec, schema) == part.key.partition


def test_a_spec_that_goes_back_while_the_commit_retries_keeps_the_originals(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit rewrites the batch's files for a new spec, the spec goes back before
    it lands: the landed commit holds the originals, which must not be deleted."""
    from sparkeos.connectors.iceberg import respec

    sink = make_sink(tmp_path)
    items = [prepared(sink, 0, 0, events(list(range(6))))]
    other = IcebergSink("db.events", catalog=catalog(tmp_path))
    with other._load().update_spec() as update:
        update.add_identity("score")
    original = respec.in_spec
    calls: list[int] = []

    def in_spec(*args: Any) -> Any:
        found = original(*args)
        calls.append(1)
        if len(calls) == 1:
            with other._load().update_spec() as update:
                update.remove_field("score")  # back to the batch's own spec
            other._load().append(pa.Table.from_batches([events([100])]).cast(
                other._load().scan().to_arrow().schema))
        return found

    monkeypatch.setattr(respec, "in_spec", in_spec)
    sink.commit_merged(items, recovering=False)
    table = sink._load()
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [0, 1, 2, 3, 4, 5, 100]
    assert all(os.path.exists(uri) for uri in referenced(table))
    assert sorted(table.scan(row_filter="region == 'eu'").to_arrow().column("id")
                  .to_pylist()) == [0, 3]


def test_a_rewrite_finds_columns_by_field_id(tmp_path: Path) -> None:
    """Another writer swaps two columns' names and partitions by a column it adds, after
    phase 1: the commit's rewrite reads the file's columns by field ID (the added one
    null), and the statistics land on the right fields."""
    sink = make_sink(tmp_path, partition_by=("truncate(1, region)",),
                     schema=SCHEMA.append(pa.field("zone", pa.string())))
    batch = events([0, 1, 2]).to_pydict()
    batch["zone"] = ["north", "south", "west"]
    items = [prepared(sink, 0, 0, pa.RecordBatch.from_pydict(
        batch, schema=SCHEMA.append(pa.field("zone", pa.string()))))]
    table = sink._load()
    with table.update_schema() as update:
        update.rename_column("region", "swap")
    with sink._load().update_schema() as update:
        update.rename_column("zone", "region")
    with sink._load().update_schema() as update:
        update.rename_column("swap", "zone")
        update.add_column("tenant", StringType())
    with sink._load().update_spec() as update:
        update.add_identity("tenant")
    sink.commit_merged(items, recovering=False)
    table = sink._load()
    assert table.scan(row_filter="zone == 'eu'").to_arrow().column("id").to_pylist() == [0]
    assert table.scan(row_filter="region == 'south'").to_arrow().column("id") \
        .to_pylist() == [1]
    assert table.scan(row_filter="tenant is null").to_arrow().num_rows == 3
    assert on_disk(tmp_path) == referenced(table)


def test_a_spec_this_process_cannot_write_arriving_before_the_commit_is_said(
        tmp_path: Path) -> None:
    from pyiceberg.transforms import BucketTransform

    sink = make_sink(tmp_path)
    items = [prepared(sink, 0, 0, events([0, 1]))]
    with sink._load().update_spec() as update:
        update.add_field("region", BucketTransform(4), "region_bucket")
    with pytest.raises(SchemaMismatchError, match="one transform per column"):
        sink.commit_merged(items, recovering=False)
    with sink._load().update_spec() as update:
        update.remove_field("region_bucket")
    sink.commit_merged(items, recovering=True)
    assert sorted(sink._load().scan().to_arrow().column("id").to_pylist()) == [0, 1]


def test_a_rollback_after_a_name_too_long(tmp_path: Path) -> None:
    from sparkeos.core.errors import DataRejectedError

    sink = make_sink(tmp_path, partition_by=("region",))
    batch = events([0]).to_pydict()
    batch["region"] = ["é" * 200]
    txn = POOL.transaction(0, 0, 0, 0)
    handle = sink.begin(txn)
    sink.write(handle, pa.RecordBatch.from_pydict(batch, schema=SCHEMA))
    with pytest.raises(DataRejectedError, match="truncate"):
        sink.prepare(handle)
    sink.rollback(txn)
    assert sink.probe(txn).name == "UNKNOWN"  # its manifest gone: nothing left
