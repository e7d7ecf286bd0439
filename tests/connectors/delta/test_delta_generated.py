"""The Delta table DeltaSink writes against the one delta-rs' own ``write_deltalake``
makes of the same rows (no ``delta-spark`` runs on the pinned Spark:
docs/connectors/delta.md), on generated rows, column types and partition columns: the
same schema, partition columns and values, rows, Parquet physical schema, and partition
directories up to their escaping (the sink escapes a directory name as Spark does,
delta-rs percent-encodes more; the log's paths name both exactly)."""

from __future__ import annotations

import datetime
import glob
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkeos.connectors.delta import DeltaSink
from sparkeos.connectors.file.layout import escape_path_name, unescape_path_name
from sparkeos.core.snapshot.txpool import TransactionPool
from tests.support.generated_tables import draw_table

POOL = TransactionPool("q1", "orders")
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)),
               max_size=12)
DATES = st.dates(datetime.date(1, 1, 1), datetime.date(9999, 12, 31))
TIMES = st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2200, 1, 1))
KINDS: dict[str, tuple[pa.DataType, Any, bool]] = {
    # name: (Arrow type as Spark hands it, values, whether the sink partitions by it)
    "i8": (pa.int8(), st.integers(-128, 127), True),
    "i16": (pa.int16(), st.integers(-2**15, 2**15 - 1), True),
    "i": (pa.int32(), st.integers(-2**31, 2**31 - 1), True),
    "l": (pa.int64(), st.integers(-2**63, 2**63 - 1), True),
    "s": (pa.string(), TEXT, True),
    "b": (pa.bool_(), st.booleans(), True),
    "d": (pa.date32(), DATES, True),
    "f": (pa.float32(), st.floats(width=32), False),
    "g": (pa.float64(), st.floats(), False),
    "t": (pa.timestamp("us", tz="UTC"), TIMES.map(
        lambda t: t.replace(tzinfo=datetime.timezone.utc)), False),
    "n": (pa.timestamp("us"), TIMES, False),
    "m": (pa.decimal128(9, 2), st.decimals(-10**6, 10**6, places=2, allow_nan=False,
                                           allow_infinity=False), False),
    "w": (pa.decimal128(38, 6), st.decimals(-10**20, 10**20, places=6, allow_nan=False,
                                            allow_infinity=False), False),
    "x": (pa.binary(), st.binary(max_size=10), False),
}


@st.composite
def tables(draw: Any) -> tuple[pa.Table, tuple[str, ...]]:
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=4,
                          unique=True))
    rows = draw_table(draw, kinds, {k: KINDS[k][:2] for k in kinds}, draw(st.integers(1, 10)))
    candidates = [f"c{kind}" for kind in kinds if KINDS[kind][2]]
    partition_by = draw(st.lists(st.sampled_from(candidates), unique=True, max_size=2)) \
        if candidates else []
    return rows, tuple(partition_by)


def directories(root: Path, decode: Callable[[str], str]) -> set[tuple[str, ...]]:
    """The partition directories holding data files, each name decoded."""
    found = set()
    for directory, _, names in os.walk(root):
        relative = os.path.relpath(directory, root)
        if relative != "." and not relative.startswith("_") \
                and any(n.endswith(".parquet") for n in names):
            found.add(tuple(decode(segment) for segment in relative.split("/")))
    return found


def physical_schema(root: Path) -> str:
    """The first data file's Parquet schema, its columns (the root group's name is the
    writer's own: ``schema``, ``arrow_schema``, Spark's ``spark_schema``)."""
    first = sorted(p for p in glob.glob(f"{root}/**/*.parquet", recursive=True)
                   if "/_sparkeos/" not in p)[0]
    return str(pq.ParquetFile(first).schema).split("\n", 2)[2]


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tables())
def test_the_same_table_as_delta_rs_writes(tmp_path_factory: pytest.TempPathFactory,
                                           case: tuple[pa.Table, tuple[str, ...]]) -> None:
    rows, partition_by = case
    tmp_path = tmp_path_factory.mktemp("generated")
    sink = DeltaSink(str(tmp_path / "ours"), partition_by=partition_by)
    sink.validate(rows.schema)
    half = rows.num_rows // 2
    items = []
    for partition, part in enumerate((rows.slice(0, half), rows.slice(half))):
        txn = POOL.transaction(0, partition, 0, 0)
        handle = sink.begin(txn)
        sink.write(handle, pa.RecordBatch.from_pydict(part.to_pydict(), schema=part.schema))
        items.append((txn, sink.prepare(handle)))
    sink.commit_merged(items, recovering=False)  # type: ignore[arg-type]
    write_deltalake(str(tmp_path / "theirs"), rows, partition_by=list(partition_by) or None)
    ours, theirs = DeltaTable(str(tmp_path / "ours")), DeltaTable(str(tmp_path / "theirs"))
    assert ours.schema().to_arrow() == theirs.schema().to_arrow()
    assert ours.metadata().partition_columns == theirs.metadata().partition_columns
    read_ours = ours.to_pyarrow_table().sort_by("id")
    read_theirs = theirs.to_pyarrow_table().sort_by("id")
    assert repr(read_ours.select(read_theirs.schema.names).to_pylist()) == \
        repr(read_theirs.to_pylist())  # repr: NaN equals NaN
    assert sorted(map(repr, (sorted(p.items()) for p in ours.partitions()))) == \
        sorted(map(repr, (sorted(p.items()) for p in theirs.partitions())))
    assert directories(tmp_path / "ours", unescape_path_name) == \
        directories(tmp_path / "theirs", unquote)
    for values in directories(tmp_path / "ours", str):  # Spark's escaping, one rule
        assert all(segment == "=".join(escape_path_name(unescape_path_name(piece))
                                       for piece in segment.split("=", 1))
                   for segment in values)
    assert physical_schema(tmp_path / "ours") == physical_schema(tmp_path / "theirs")
