"""Benchmark: the exactly-once FileSink against a plain (at-least-once) foreachBatch write.

Both modes read the same streaming input (one pre-generated Parquet file per micro-batch,
``maxFilesPerTrigger=1``, ``trigger(availableNow=True)``) in the same SparkSession:

* ``exactly_once``: ``foreachBatch(exactly_once(FileSink(out, format=fmt), name="bench"))``
* ``plain``:        ``foreachBatch(lambda df, id: df.write.mode("append").parquet(out))``
  (``.json(out)`` for ``--format jsonl``), what users write today.
* ``plain_coalesced``: the same, after ``df.coalesce(<cores>)`` (what a user who tuned
  for small files writes; exactly-once's writers do the same).
* ``spark_sink``:   Spark's own streaming file sink, ``writeStream.format("parquet")``
  (``"json"``) with ``path``.
* ``format``:       the same sink through Spark's Python streaming writer,
  ``writeStream.format("sparkeos-parquet")`` (``"sparkeos-json"``); exactly-once.
* ``format_coalesced``: ``format`` after ``.coalesce(<cores>)`` on the stream (what the
  docs advise where a batch has many small partitions).
* ``python_floor``: a Python streaming sink that writes nothing (``bench/_floor.py``):
  what Spark's Python data source route costs at this partitioning before any sink
  does anything; ``ratio format/python floor`` is the format's cost above it.

Each full query (start -> awaitTermination) is timed; the modes run alternately for
``--repeats`` rounds (the order rotates every round) and medians are reported. The last
line is ``ratio exactly_once/plain: <x>`` (median wall time of exactly-once / the
faster of the two plain writes).
The exactly-once output is checked (row count and distinct ids equal the input); a
mismatch exits with status 1.

Both modes read the same files with the same partitioning: the source's own (two
partitions on ``local[2]``; ``spark.sql.files.openCostInBytes`` is lowered so each file
splits evenly instead of 7:1), or ``--partitions N`` adds ``.repartition(N)`` to both.
A warm-up run of each mode (2 x min(rows, 50k) rows) precedes the timed runs. Before
the table, per-batch medians of Spark's ``addBatch`` for both modes and the exactly-once
adapter's own split (``adapter.metrics``: phase-1 job, decide, commit, the rest) show
where the difference goes. ``--no-fsync`` measures what the sink's fsyncs cost.

    .venv/bin/python bench/file_sink.py --rows-per-batch 200000 --batches 5 --format parquet

``--store s3`` puts every mode's output and checkpoint on the checkout's local
S3-compatible store instead (Spark through S3A, the exactly-once sink through
conditional writes): one store, side by side.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from _floor import noop_source  # bench/ is the script's directory
from _split import adapter_split

SCHEMA_DDL = "id long, payload string, value double, ts {ts_type}"
MODES = ("exactly_once", "plain", "plain_coalesced", "spark_sink", "format", "format_coalesced",
         "python_floor")
EXACTLY_ONCE = ("exactly_once", "format", "format_coalesced")
PLAIN_MODES = ("plain", "plain_coalesced", "spark_sink")
_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" * 3


@dataclass
class RunResult:
    mode: str
    rows: int
    seconds: float
    add_batch_ms: list[float] = field(default_factory=list)
    trigger_ms: list[float] = field(default_factory=list)
    sink_metrics: list[Any] = field(default_factory=list)


# -- input ---------------------------------------------------------------------------------
def _batch_table(batch: int, rows: int) -> pa.Table:
    start = batch * rows
    ids = range(start, start + rows)
    # 63..102 bytes per payload, deterministic.
    payload = [f"{i:012d}:" + _ALPHABET[i % 61: i % 61 + 50 + i % 40] for i in ids]
    base_us = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "payload": pa.array(payload, pa.string()),
        "value": pa.array([i * 0.5 for i in ids], pa.float64()),
        "ts": pa.array([base_us + i * 1000 for i in ids], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")),
    })


def generate_input(directory: str, batches: int, rows: int) -> int:
    """One Parquet file per micro-batch; several row groups so Spark can split a file."""
    os.makedirs(directory, exist_ok=True)
    now = time.time() - batches - 10
    for b in range(batches):
        path = os.path.join(directory, f"batch-{b:05d}.parquet")
        pq.write_table(_batch_table(b, rows), path, row_group_size=max(1, rows // 8))
        os.utime(path, (now + b, now + b))  # distinct mtimes: a stable pick order
    return batches * rows


# -- one query ---------------------------------------------------------------------------------
def run_query(spark: Any, mode: str, fmt: str, input_dir: str, out: str, checkpoint: str,
              partitions: int, fsync: bool, ts_type: str) -> RunResult:
    from sparkeos import exactly_once
    from sparkeos.connectors.file import FileSink

    source = (spark.readStream.schema(SCHEMA_DDL.format(ts_type=ts_type))
              .option("maxFilesPerTrigger", 1).parquet(input_dir))
    if partitions > 0:
        source = source.repartition(partitions)

    adapter = None
    if mode == "exactly_once":
        adapter = exactly_once(FileSink(out, format=fmt, fsync=fsync), name="bench")
        body: Any = adapter
    else:
        writers = spark.sparkContext.defaultParallelism if mode == "plain_coalesced" else 0

        def body(df: Any, batch_id: int) -> None:
            if writers and df.rdd.getNumPartitions() > writers:
                df = df.coalesce(writers)
            if fmt == "parquet":
                df.write.mode("append").parquet(out)
            else:
                df.write.mode("append").json(out)

    started = time.perf_counter()
    if mode == "spark_sink":  # Spark's own streaming file sink (its own commit log)
        writer = source.writeStream.format("parquet" if fmt == "parquet" else "json") \
            .option("path", out)
    elif mode == "python_floor":  # a Python streaming sink that writes nothing
        spark.dataSource.register(noop_source())
        writer = source.writeStream.format("bench-noop")
    elif mode in ("format", "format_coalesced"):  # the same sink, through Spark's own API
        name = "sparkeos-parquet" if fmt == "parquet" else "sparkeos-json"
        if mode == "format_coalesced":
            source = source.coalesce(spark.sparkContext.defaultParallelism)
        writer = (source.writeStream.format(name)
                  .option("path", out).option("sparkeos.fsync", str(fsync).lower()))
    else:
        writer = source.writeStream.foreachBatch(body)
    query = (writer.option("checkpointLocation", checkpoint)
             .trigger(availableNow=True)
             .start())
    query.awaitTermination()
    seconds = time.perf_counter() - started

    result = RunResult(mode, 0, seconds)
    for progress in query.recentProgress:
        if not progress.numInputRows:
            continue
        result.rows += progress.numInputRows
        result.add_batch_ms.append(float(progress.durationMs.get("addBatch", 0)))
        result.trigger_ms.append(float(progress.durationMs.get("triggerExecution", 0)))
    if adapter is not None:
        result.sink_metrics = list(adapter.metrics)
    return result


def count_output(mode: str, fmt: str, out: str) -> tuple[int, int]:
    """(rows, distinct ids) written to ``out``."""
    if mode in EXACTLY_ONCE:
        from sparkeos.connectors.file import read_output

        table = read_output(out, fmt)
        if table.num_rows == 0:
            return 0, 0
        return table.num_rows, pc.count_distinct(table["id"]).as_py()
    # Spark's part files (pyarrow.dataset's JSON reader hangs on these; read file by file).
    import pyarrow.json as pj

    from sparkeos.core.storage.registry import split_uri

    files, root = split_uri(out)
    rows = 0
    for name in files.listdir(root):
        if not name.startswith("part-"):
            continue
        data = pa.BufferReader(files.read(f"{root}/{name}"))
        if fmt == "parquet":
            rows += pq.ParquetFile(data).metadata.num_rows
        else:
            rows += pj.read_json(data).num_rows
    return rows, -1


def remove(location: str) -> None:
    from sparkeos.core.storage.registry import split_uri

    files, path = split_uri(location)
    files.delete(path)


# -- reporting ---------------------------------------------------------------------------
def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def print_profile(results: dict[str, list[RunResult]]) -> None:
    print("\nper-batch medians over all timed runs (ms):")
    for mode in MODES:
        add = [v for r in results[mode] for v in r.add_batch_ms]
        trig = [v for r in results[mode] for v in r.trigger_ms]
        print(f"  {mode:<13} addBatch {_median(add):8.1f}   triggerExecution "
              f"{_median(trig):8.1f}   (n={len(add)})")
    metrics = [m for r in results["exactly_once"] for m in r.sink_metrics
               if m.outcome == "committed"]
    if metrics:
        print(f"  exactly_once sink: {adapter_split(metrics)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows-per-batch", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    parser.add_argument("--partitions", type=int, default=0,
                        help="repartition(n) the source in both modes (0: keep the "
                        "source's partitioning)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-fsync", action="store_true",
                        help="FileSink(fsync=False): to measure what durability costs")
    parser.add_argument("--work-dir", default=None,
                        help="where input and outputs go (default: a new temp dir, removed)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--store", choices=("local", "s3"), default="local",
                        help="where outputs and checkpoints go: the work directory, or the "
                        "checkout's local S3-compatible store (docker/services/s3.sh; "
                        "Spark through S3A, sparkeos through conditional writes)")
    parser.add_argument("--ts-type", choices=("timestamp", "timestamp_ntz"),
                        default="timestamp", help="Spark type of the ts column")
    args = parser.parse_args(argv)
    if args.rows_per_batch < 1 or args.batches < 1 or args.repeats < 1:
        parser.error("--rows-per-batch, --batches and --repeats must be >= 1")

    from sparkeos.core.streaming.spark import local_session

    work = args.work_dir or tempfile.mkdtemp(prefix="sparkeos-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        t = time.perf_counter()
        total = generate_input(os.path.join(work, "input"), args.batches, args.rows_per_batch)
        warmup_rows = min(args.rows_per_batch, 50_000)
        generate_input(os.path.join(work, "warmup-input"), 2, warmup_rows)
        print(f"input: {args.batches} batches x {args.rows_per_batch} rows = {total} rows "
              f"(generated in {time.perf_counter() - t:.1f} s); format {args.format}, "
              f"partitions {args.partitions or 'source'}, fsync {not args.no_fsync}",
              flush=True)

        conf = {"spark.ui.showConsoleProgress": "false",
                # Split each input file evenly over the cores (the default 4 MB open cost
                # gives a 7:1 split here).
                "spark.sql.files.openCostInBytes": "65536"}
        base = work
        if args.store == "s3":
            from sparkeos.testing.s3a import s3a_spark_conf, start_local_store

            start_local_store("sparkeos-bench")
            conf.update(s3a_spark_conf())
            base = f"s3a://sparkeos-bench/{os.path.basename(work)}"
            print(f"outputs and checkpoints in {base}", flush=True)
        spark = local_session("sparkeos-bench", master=args.master, conf=conf)
        fsync = not args.no_fsync

        def one(mode: str, tag: str, input_dir: str, expected: int) -> RunResult:
            out = f"{base}/out-{tag}-{mode}"
            ckpt = f"{base}/ckpt-{tag}-{mode}"
            result = run_query(spark, mode, args.format, input_dir, out, ckpt,
                               args.partitions, fsync, args.ts_type)
            rows, distinct = (count_output(mode, args.format, out)
                              if mode != "python_floor" else (result.rows, -1))
            remove(out)
            remove(ckpt)
            if mode in EXACTLY_ONCE and not (rows == distinct == expected):
                print(f"FAIL: {mode} output has {rows} rows ({distinct} distinct ids), "
                      f"input has {expected}", file=sys.stderr)
                raise SystemExit(1)
            if mode not in EXACTLY_ONCE and rows != expected:
                print(f"warning: plain output has {rows} rows, input {expected}",
                      file=sys.stderr)
            return result

        t = time.perf_counter()
        for mode in MODES:  # warm-up: JVM code paths, Python workers, imports
            one(mode, "warmup", os.path.join(work, "warmup-input"), 2 * warmup_rows)
        print(f"warm-up done in {time.perf_counter() - t:.1f} s", flush=True)

        results: dict[str, list[RunResult]] = {m: [] for m in MODES}
        for r in range(args.repeats):
            order = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            for mode in order:
                res = one(mode, str(r), os.path.join(work, "input"), total)
                results[mode].append(res)
                print(f"  run {r + 1}/{args.repeats} {mode:<13} {res.seconds:7.2f} s  "
                      f"{res.rows / res.seconds:10.0f} rows/s  batches {len(res.add_batch_ms)}",
                      flush=True)
        spark.stop()

        print_profile(results)
        seconds = {m: _median([r.seconds for r in results[m]]) for m in MODES}
        print(f"\n{'mode':<13} {'rows':>10} {'seconds':>9} {'rows/s':>10}")
        for mode in MODES:
            print(f"{mode:<13} {total:>10} {seconds[mode]:>9.2f} "
                  f"{total / seconds[mode]:>10.0f}")
        fastest = min(PLAIN_MODES, key=lambda m: seconds[m])
        print(f"fastest plain write: {fastest}")
        print(f"ratio format/foreachBatch: {seconds['format'] / seconds['exactly_once']:.2f}")
        print(f"ratio format/python floor: {seconds['format'] / seconds['python_floor']:.2f}")
        print(f"ratio format coalesced/foreachBatch: "
              f"{seconds['format_coalesced'] / seconds['exactly_once']:.2f}")
        print(f"ratio exactly_once/plain: {seconds['exactly_once'] / seconds[fastest]:.2f}")
        return 0
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
