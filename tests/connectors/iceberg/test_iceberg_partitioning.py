"""IcebergSink on partitioned tables (pyiceberg's SQL catalog on SQLite, local paths; no
Spark): the spec ``partition_by`` names or the table's own, files under their partition's
path with the partition record phase 1 computed, the same data files as pyiceberg's own
append of the same rows (generated), NaN kept, a crash at every protocol point, and what
is refused up front or when the spec changes under a decided batch."""

from __future__ import annotations

import datetime
import decimal
import math
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    referenced = {task.file.file_path.removeprefix("file://")
                  for task in table.scan().plan_files()}
    on_disk = {str(p) for p in (tmp_path / "warehouse").rglob("*.parquet")}
    assert on_disk == referenced  # a rollback left no file behind, deleted none of these


def test_nan_in_a_float_partition_is_kept(tmp_path: Path) -> None:
    """pyiceberg's own append of these rows fails (it splits by ``==``, which NaN never
    is); the sink groups NaN with NaN."""
    sink = make_sink(tmp_path, partition_by=("score",))
    batch = pa.RecordBatch.from_pydict({
        "id": [1, 2, 3, 4], "region": ["eu"] * 4,
        "at": pa.array([START] * 4, pa.timestamp("us", tz="UTC")),
        "score": [math.nan, math.nan, None, 1.5]})
    sink.commit_merged([prepared(sink, 0, 0, batch)], recovering=False)
    table = sink._load()
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == [1, 2, 3, 4]
    nan_files = [rows for values, rows, _ in entries(table)
                 if isinstance(values[0], float) and math.isnan(values[0])]
    assert nan_files == [2]
    with pytest.raises(ConfigurationError, match="cannot put a NaN"):
        IcebergSink("db.events", catalog=catalog(tmp_path), key=("id",)).validate(SCHEMA)


def test_a_spec_changed_under_a_decided_batch_is_refused_then_commits(
        tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    items = [prepared(sink, 0, 0, events([0, 1]))]
    with sink._load().update_spec() as update:
        update.add_identity("score")
    with pytest.raises(SchemaMismatchError, match="partition spec"):
        sink.commit_merged(items, recovering=False)
    assert sink._load().current_snapshot() is None
    with sink._load().update_spec() as update:  # back as it was: the same spec again
        update.remove_field("score")
    sink.commit_merged(items, recovering=True)
    assert sorted(sink._load().scan().to_arrow().column("id").to_pylist()) == [0, 1]


def test_what_cannot_be_partitioned_is_refused_up_front(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="not a column of the batch"):
        make_sink(tmp_path, partition_by=("days(when)",))
    with pytest.raises(ConfigurationError, match="partitioned by \\['region', 'day\\(at\\)'\\]"):
        make_sink(tmp_path)
        make_sink(tmp_path, partition_by=("region",))


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
}
TRANSFORMS = {"i": ["{}", "bucket(3, {})", "truncate(10, {})"],
              "l": ["{}", "bucket(5, {})", "truncate(100, {})"],
              "s": ["{}", "bucket(4, {})", "truncate(2, {})"], "b": ["{}"],
              "d": ["{}", "years({})", "months({})", "days({})"],
              "t": ["{}", "years({})", "months({})", "days({})", "hours({})"],
              "m": ["{}", "bucket(4, {})", "truncate(50, {})"], "x": ["{}", "bucket(2, {})"]}


@st.composite
def partitioned_rows(draw: Any) -> tuple[pa.Table, tuple[str, ...]]:
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=3,
                          unique=True))
    count = draw(st.integers(1, 12))
    columns: dict[str, pa.Array] = {"id": pa.array(range(count), pa.int64())}
    for kind in kinds:
        kind_type, values = KINDS[kind]
        columns[f"c{kind}"] = pa.array(
            draw(st.lists(st.one_of(st.none(), values), min_size=count, max_size=count)),
            kind_type)
    spec = tuple(draw(st.sampled_from(TRANSFORMS[k])).format(f"c{k}") for k in kinds)
    return pa.table(columns), spec


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
            kept = totals.setdefault(repr(values), [0, path])
            kept[0] += count
        return totals

    assert by_partition(mine) == by_partition(pyicebergs)
    assert ours.schema() == theirs._load().schema() and ours.spec() == theirs._load().spec()
    read_ours = ours.scan().to_arrow().sort_by("id")
    read_theirs = theirs._load().scan().to_arrow().sort_by("id")
    assert read_ours.equals(read_theirs)


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
