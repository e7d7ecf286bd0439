"""Both file formats keep values and types through the exactly-once path."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from sparkeos import exactly_once
from sparkeos.connectors.file import FileSink, committed_files, read_output

ROWS = [
    {"id": 1, "name": "a", "score": 1.5, "ts": "2026-01-02T03:04:05", "ok": True},
    {"id": 2, "name": None, "score": None, "ts": None, "ok": False},
    {"id": 3, "name": 'quote " and \\ newline\n', "score": -0.25, "ts": "2026-06-30T23:59:59",
     "ok": None},
]
SCHEMA = "id long, name string, score double, ts timestamp, ok boolean"


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_values_round_trip(spark, tmp_path, fmt):
    in_dir = tmp_path / "in"
    in_dir.mkdir()
    (in_dir / "rows.json").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    out = str(tmp_path / "out")
    df = spark.readStream.schema(SCHEMA).json(str(in_dir))
    query = (df.writeStream.foreachBatch(exactly_once(FileSink(out, format=fmt), name="fmt"))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert committed_files(out, fmt)
    rows = sorted(read_output(out, fmt).to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == [1, 2, 3]
    assert rows[2]["name"] == ROWS[2]["name"] and rows[1]["name"] is None
    assert rows[0]["score"] == 1.5 and rows[1]["score"] is None
    assert rows[0]["ok"] is True and rows[2]["ok"] is None
    ts = rows[0]["ts"]
    if isinstance(ts, str):  # JSON Lines carries ISO text
        ts = dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    assert ts.replace(tzinfo=None) == dt.datetime(2026, 1, 2, 3, 4, 5)
    # Spark itself reads the committed output and skips the hidden staging directory.
    reader = spark.read.parquet(out) if fmt == "parquet" else spark.read.json(out)
    assert reader.count() == 3


def test_json_lines_are_what_sparks_own_json_writer_writes(spark, tmp_path):
    """JSON Lines are made by Spark's JSON generator in the JVM (``to_json``), so the
    exactly-once output and ``df.write.json`` of the same rows hold the same lines."""
    in_dir = tmp_path / "in"
    in_dir.mkdir()
    (in_dir / "rows.json").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    out, plain = str(tmp_path / "out"), str(tmp_path / "plain")
    df = spark.readStream.schema(SCHEMA).json(str(in_dir))
    query = (df.writeStream.foreachBatch(exactly_once(FileSink(out, format="jsonl"),
                                                      name="fmt"))
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.read.schema(SCHEMA).json(str(in_dir)).write.json(plain)

    def lines(files: list[str]) -> list[str]:
        found: list[str] = []
        for file in files:
            with open(file) as fh:
                found += fh.read().splitlines()
        return sorted(found)

    ours = lines(committed_files(out, "jsonl"))
    spark_lines = lines([str(p) for p in sorted((tmp_path / "plain").glob("part-*.json"))])
    assert len(ours) == 3 and ours == spark_lines
