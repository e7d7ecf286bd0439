"""Benchmark: the exactly-once DeltaSink against the fastest Delta write a user could pick.

Spark's own Delta sink (``delta-spark``) has no release for the pinned Spark (its newest,
4.4.1, needs pyspark <= 4.2.0: docs/connectors/delta.md), so the baseline is what a
PySpark job writes with delta-rs today, in the same SparkSession, on the same input
(``file_sink.py``'s: one Parquet file per micro-batch, ``trigger(availableNow=True)``):

* ``exactly_once``: ``foreachBatch(exactly_once(DeltaSink(out), name="bench"))``;
* ``format``: the same sink as ``writeStream.format("sparkeos-delta")``;
* ``write_deltalake``: ``foreachBatch(lambda df, id: write_deltalake(out, df.toArrow(),
  mode="append"))``, at-least-once (a replayed batch is appended again);
* ``python_floor``: a Python streaming sink that writes nothing (``bench/_floor.py``).

``--partitions N`` adds ``.repartition(N)`` to the source in every mode. Each full query
(start -> awaitTermination) is timed; the modes alternate for ``--repeats`` rounds and
medians are reported, after a warm-up run of each. Every output is read back with
delta-rs: exactly-once modes must hold each input id once (else exit status 1). The last
lines are ``ratio exactly_once/write_deltalake: <x>`` and ``ratio format/write_deltalake:
<x>``.

    .venv/bin/python bench/delta_sink.py --rows-per-batch 100000 --batches 3 --partitions 20
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import pyarrow.compute as pc
from _floor import noop_source  # bench/ is the script's directory
from _split import adapter_split
from file_sink import SCHEMA_DDL, generate_input

MODES = ("exactly_once", "format", "write_deltalake", "python_floor")
EXACTLY_ONCE = ("exactly_once", "format")


def run_query(spark: Any, mode: str, input_dir: str, out: str, checkpoint: str,
              partitions: int) -> tuple[float, list[float], list[Any]]:
    """(seconds, addBatch ms per batch, the adapter's metrics) of one query."""
    from sparkeos import exactly_once
    from sparkeos.connectors.delta import DeltaSink

    source = (spark.readStream.schema(SCHEMA_DDL.format(ts_type="timestamp"))
              .option("maxFilesPerTrigger", 1).parquet(input_dir))
    if partitions > 0:
        source = source.repartition(partitions)
    adapter = None
    if mode == "exactly_once":
        adapter = exactly_once(DeltaSink(out), name="bench")
        writer = source.writeStream.foreachBatch(adapter)
    elif mode == "format":
        writer = source.writeStream.format("sparkeos-delta").option("path", out)
    elif mode == "write_deltalake":
        from deltalake import write_deltalake

        def append(df: Any, batch_id: int) -> None:
            write_deltalake(out, df.toArrow(), mode="append")

        writer = source.writeStream.foreachBatch(append)
    else:
        spark.dataSource.register(noop_source())
        writer = source.writeStream.format("bench-noop")
    started = time.perf_counter()
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    add_batch = [float(p.durationMs.get("addBatch", 0)) for p in query.recentProgress
                 if p.numInputRows]
    return seconds, add_batch, list(adapter.metrics) if adapter is not None else []


def count_output(out: str) -> tuple[int, int]:
    """(rows, distinct ids) of the Delta table at ``out``."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(out):
        return 0, 0
    ids = DeltaTable(out).to_pyarrow_table(columns=["id"]).column("id")
    return len(ids), pc.count_distinct(ids).as_py()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows-per-batch", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=0,
                        help="repartition(n) the source in every mode (0: the source's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    if args.rows_per_batch < 1 or args.batches < 1 or args.repeats < 1:
        parser.error("--rows-per-batch, --batches and --repeats must be >= 1")

    from sparkeos.core.streaming.spark import local_session

    work = tempfile.mkdtemp(prefix="sparkeos-bench-delta-")
    try:
        total = generate_input(os.path.join(work, "input"), args.batches, args.rows_per_batch)
        warmup = min(args.rows_per_batch, 20_000)
        generate_input(os.path.join(work, "warmup-input"), 2, warmup)
        print(f"input: {args.batches} batches x {args.rows_per_batch} rows = {total} rows; "
              f"partitions {args.partitions or 'source'}", flush=True)
        spark = local_session("sparkeos-bench-delta", master=args.master,
                              conf={"spark.ui.showConsoleProgress": "false",
                                    "spark.sql.files.openCostInBytes": "65536"})

        def one(mode: str, tag: str, input_dir: str,
                expected: int) -> tuple[float, list[float], list[Any]]:
            out, ckpt = os.path.join(work, f"out-{tag}-{mode}"), os.path.join(work, f"ck-{tag}")
            result = run_query(spark, mode, input_dir, out, ckpt, args.partitions)
            rows, distinct = count_output(out) if mode != "python_floor" else (expected,) * 2
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(ckpt, ignore_errors=True)
            if mode in EXACTLY_ONCE and not rows == distinct == expected:
                print(f"FAIL: {mode} table has {rows} rows ({distinct} distinct ids), input "
                      f"has {expected}", file=sys.stderr)
                raise SystemExit(1)
            return result

        for mode in MODES:  # warm-up: JVM code paths, Python workers, imports
            one(mode, "warmup", os.path.join(work, "warmup-input"), 2 * warmup)
        results: dict[str, list[tuple[float, list[float], list[Any]]]] = {m: [] for m in MODES}
        for r in range(args.repeats):
            for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
                res = one(mode, str(r), os.path.join(work, "input"), total)
                results[mode].append(res)
                print(f"  run {r + 1}/{args.repeats} {mode:<16} {res[0]:7.2f} s", flush=True)
        spark.stop()

        print("\nper-batch medians over all timed runs (ms):")
        for mode in MODES:
            add = [v for res in results[mode] for v in res[1]]
            print(f"  {mode:<16} addBatch {statistics.median(add) if add else 0.0:8.1f}")
        metrics = [m for res in results["exactly_once"] for m in res[2]
                   if m.outcome == "committed"]
        if metrics:
            print(f"  exactly_once sink: {adapter_split(metrics)}")
        seconds = {m: statistics.median(res[0] for res in results[m]) for m in MODES}
        print(f"\n{'mode':<16} {'rows':>10} {'seconds':>9} {'rows/s':>10}")
        for mode in MODES:
            print(f"{mode:<16} {total:>10} {seconds[mode]:>9.2f} {total / seconds[mode]:>10.0f}")
        for mode in EXACTLY_ONCE:
            print(f"ratio {mode}/write_deltalake: "
                  f"{seconds[mode] / seconds['write_deltalake']:.2f}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
