"""Benchmark: what exactly-once adds to every micro-batch, on tiny batches.

Tiny batches (``--rows`` rows each, default 10; ``--batches`` of them, default 40) are
where a fixed per-batch cost shows: the same streaming input (one Parquet file per
micro-batch, ``maxFilesPerTrigger=1``, ``availableNow``) is written in one SparkSession
by

* ``plain``:        ``foreachBatch(lambda df, id: df.write.mode("append").parquet(out))``
* ``exactly_once``: ``foreachBatch(exactly_once(FileSink(out), name="overhead"))``

after a warm-up query of each, in classic PySpark and then (unless ``--classic-only``)
through Spark Connect (a local Connect server, ``SparkSession.builder.remote``).
Reported: the median of Spark's ``addBatch`` per batch for each mode (the first
``--skip`` batches of a query left out: they pay for the query's start), the adapter's
own split of an exactly-once batch (classic: under Connect the adapter runs in the
server's Python process), and per session kind ``overhead per batch: <ms>`` (median
exactly-once addBatch - median plain addBatch).

    ./run bench overhead
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

import pyarrow as pa
import pyarrow.parquet as pq
from _split import adapter_split, median_of  # bench/ is the script's directory

MODES = ("plain", "exactly_once")


def generate_input(directory: str, batches: int, rows: int) -> None:
    os.makedirs(directory, exist_ok=True)
    now = time.time() - batches - 10
    for b in range(batches):
        ids = range(b * rows, (b + 1) * rows)
        table = pa.table({"id": pa.array(ids, pa.int64()),
                          "payload": pa.array([f"row-{i}" for i in ids])})
        path = os.path.join(directory, f"batch-{b:05d}.parquet")
        pq.write_table(table, path)
        os.utime(path, (now + b, now + b))  # distinct mtimes: a stable pick order


def run_query(spark: Any, mode: str, input_dir: str, work: str, tag: str) -> tuple[
        list[float], list[Any]]:
    """(addBatch ms of every batch, the adapter's metrics: classic only)."""
    from sparkeos import exactly_once
    from sparkeos.connectors.file import FileSink

    out = os.path.join(work, f"out-{mode}-{tag}")
    body: Any
    checkpoint = os.path.join(work, f"ckpt-{mode}-{tag}")
    if mode == "exactly_once":
        body = exactly_once(FileSink(out), name="overhead", checkpoint_location=checkpoint)
    else:
        def body(df: Any, batch_id: int) -> None:
            df.write.mode("append").parquet(out)
    source = (spark.readStream.schema("id long, payload string")
              .option("maxFilesPerTrigger", 1).parquet(input_dir))
    query = (source.writeStream.foreachBatch(body)
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    add_batch = [float(p.durationMs.get("addBatch", 0)) for p in query.recentProgress
                 if p.numInputRows]
    return add_batch, list(getattr(body, "metrics", []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--skip", type=int, default=3,
                        help="leading batches of each query left out of the medians")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--classic-only", action="store_true",
                        help="skip the Spark Connect measurement")
    args = parser.parse_args(argv)
    if args.batches <= args.skip:
        parser.error("--batches must be above --skip")

    work = tempfile.mkdtemp(prefix="sparkeos-bench-overhead-")
    try:
        input_dir, warm_dir = os.path.join(work, "input"), os.path.join(work, "warm")
        generate_input(input_dir, args.batches, args.rows)
        generate_input(warm_dir, 5, args.rows)
        overheads = {"classic": measure("classic", args, work, input_dir, warm_dir)}
        if not args.classic_only:
            overheads["connect"] = measure("connect", args, work, input_dir, warm_dir)
        print(f"rows per batch {args.rows}, batches {args.batches}, master {args.master}")
        for kind, overhead in overheads.items():
            print(f"overhead per batch: {overhead:.1f} ms ({kind})")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(kind: str, args: Any, work: str, input_dir: str, warm_dir: str) -> float:
    """exactly-once minus plain median addBatch, in one session of ``kind``."""
    from sparkeos.core.streaming.spark import connect_session, local_session

    conf = {"spark.ui.showConsoleProgress": "false"}
    spark = (connect_session if kind == "connect" else local_session)(
        f"sparkeos-bench-overhead-{kind}", args.master, conf)
    try:
        for mode in MODES:
            run_query(spark, mode, warm_dir, work, f"{kind}-warm")
        medians: dict[str, float] = {}
        metrics: list[Any] = []
        for mode in MODES:
            add_batch, found = run_query(spark, mode, input_dir, work, f"{kind}-timed")
            kept = add_batch[args.skip:]
            medians[mode] = statistics.median(kept)
            metrics += found[args.skip:]
            print(f"{kind} {mode:<13} addBatch median {medians[mode]:7.1f} ms "
                  f"(min {min(kept):.0f}, max {max(kept):.0f}, n={len(kept)})", flush=True)
    finally:
        spark.stop()
    if metrics:
        print(f"{kind} exactly_once adapter per batch (ms): {adapter_split(metrics)}; the "
              f"rest of addBatch (Spark's call into Python, as for plain) "
              f"{medians['exactly_once'] - median_of(metrics, 'total_ms'):.1f}")
    return medians["exactly_once"] - medians["plain"]


if __name__ == "__main__":
    sys.exit(main())
