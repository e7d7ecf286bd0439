"""Benchmark: the first batch of a fresh job, through each route.

Most ``availableNow`` jobs are one or two batches: there the first batch is the job.
Each run is a new driver process (a new JVM, new Python workers: what a scheduled job
pays) that reads one Parquet file of ``--rows`` rows and writes it with

* ``spark_sink``:   Spark's own streaming parquet sink, ``writeStream.format("parquet")``;
* ``foreachBatch``: ``foreachBatch(exactly_once(FileSink(out), name="first"))``;
* ``format``:       ``writeStream.format("sparkeos-parquet")``, the same sink;
* ``noop_foreachBatch`` and ``noop_format``: Spark's floor for each route, a
  ``foreachBatch`` function that counts the rows in Python workers (``mapInArrow``, as
  sparkeos' phase 1 runs) and a Python streaming sink (``DataSourceStreamArrowWriter``)
  that counts them, no sparkeos in either: what Spark's own Python processes cost a
  Python sink's first batch, whoever writes it.

The modes run alternately for ``--repeats`` rounds. Reported per mode, as medians: the
first batch's ``triggerExecution`` (Spark's own measure of the batch, from planning to
its commit) and its ``addBatch``, and the process's wall time from start to exit. The
last lines are ``Spark's floor, format - foreachBatch: <ms>`` (the noop modes),
``first batch format - foreachBatch: <ms>`` (sparkeos' routes) and ``format above
Spark's floor: <ms>``, what sparkeos adds to the format route's first batch beyond what
Spark's own processes cost any Python sink (target: at most 1000 ms).
Every run's output is counted: a run without exactly ``--rows`` rows fails the bench.

    ./run bench first_batch
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _floor import noop_source  # bench/ is the script's directory

MODES = ("spark_sink", "foreachBatch", "format", "noop_foreachBatch", "noop_format")


def _count_in_python(df: Any, batch_id: int) -> None:
    """The rows through Python workers in Arrow, as the foreachBatch route's phase 1."""
    import pyarrow as pa

    def count(batches: Any) -> Any:
        yield pa.RecordBatch.from_pydict({"rows": [sum(b.num_rows for b in batches)]})

    df.mapInArrow(count, "rows long").collect()


def child(mode: str, work: str) -> int:
    """One job in this process: prints one JSON line with the first batch's figures."""
    from sparkeos import exactly_once
    from sparkeos.connectors.file import FileSink, read_output
    from sparkeos.core.streaming.spark import local_session

    spark = local_session("sparkeos-first-batch", "local[2]",
                          {"spark.ui.showConsoleProgress": "false"})
    source = spark.readStream.schema("id long, payload string").parquet(
        os.path.join(work, "input"))
    out, checkpoint = os.path.join(work, f"out-{mode}"), os.path.join(work, f"ckpt-{mode}")
    if mode == "spark_sink":
        writer = source.writeStream.format("parquet").option("path", out)
    elif mode == "noop_format":
        spark.dataSource.register(noop_source())
        writer = source.writeStream.format("bench-noop")
    elif mode == "noop_foreachBatch":
        writer = source.writeStream.foreachBatch(_count_in_python)
    elif mode == "format":
        writer = source.writeStream.format("sparkeos-parquet").option("path", out)
    else:
        writer = source.writeStream.foreachBatch(exactly_once(FileSink(out), name="first"))
    query = (writer.option("checkpointLocation", checkpoint).trigger(availableNow=True)
             .start())
    query.awaitTermination()
    first = next(p for p in query.recentProgress if p.numInputRows)
    if mode.startswith("noop"):
        rows = first.numInputRows
    elif mode == "spark_sink":
        rows = spark.read.parquet(out).count()
    else:
        rows = read_output(out).num_rows
    print(json.dumps({"trigger_ms": first.durationMs.get("triggerExecution", 0),
                      "add_batch_ms": first.durationMs.get("addBatch", 0), "rows": rows}),
          flush=True)
    spark.stop()
    return 0


def run_child(mode: str, work: str) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, work],
                          capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - started
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        print(f"FAIL: the {mode} job failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}",
              file=sys.stderr)
        raise SystemExit(1)
    figures: dict[str, Any] = json.loads(lines[-1])
    figures["wall_s"] = wall
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "WORKDIR"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(*args.child)

    import pyarrow as pa
    import pyarrow.parquet as pq

    work = tempfile.mkdtemp(prefix="sparkeos-first-batch-")
    try:
        os.makedirs(os.path.join(work, "input"))
        ids = pa.array(range(args.rows), pa.int64())
        pq.write_table(pa.table({"id": ids, "payload": pa.array(
            [f"row-{i}" for i in range(args.rows)])}),
            os.path.join(work, "input", "part-0.parquet"))
        print(f"input: one file of {args.rows} rows; {args.repeats} fresh jobs per mode",
              flush=True)
        results: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
        for r in range(args.repeats):
            for mode in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:
                run_dir = os.path.join(work, f"run-{r}-{mode}")
                os.makedirs(run_dir)
                os.symlink(os.path.join(work, "input"), os.path.join(run_dir, "input"))
                figures = run_child(mode, run_dir)
                shutil.rmtree(run_dir, ignore_errors=True)
                if figures["rows"] != args.rows:
                    print(f"FAIL: {mode} wrote {figures['rows']} rows of {args.rows}",
                          file=sys.stderr)
                    return 1
                results[mode].append(figures)
                print(f"  run {r + 1}/{args.repeats} {mode:<13} first batch "
                      f"{figures['trigger_ms']:6.0f} ms (addBatch {figures['add_batch_ms']:6.0f})"
                      f"  job {figures['wall_s']:5.1f} s", flush=True)
        median = {m: {k: statistics.median(f[k] for f in results[m])
                      for k in ("trigger_ms", "add_batch_ms", "wall_s")} for m in MODES}
        print(f"\n{'mode':<13} {'first batch ms':>15} {'addBatch ms':>12} {'job s':>7}")
        for mode in MODES:
            m = median[mode]
            print(f"{mode:<13} {m['trigger_ms']:>15.0f} {m['add_batch_ms']:>12.0f} "
                  f"{m['wall_s']:>7.1f}")
        floor = (median["noop_format"]["trigger_ms"]
                 - median["noop_foreachBatch"]["trigger_ms"])
        print(f"Spark's floor, format - foreachBatch: {floor:.0f} ms")
        gap = median["format"]["trigger_ms"] - median["foreachBatch"]["trigger_ms"]
        print(f"first batch format - foreachBatch: {gap:.0f} ms")
        print(f"format above Spark's floor: {gap - floor:.0f} ms")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
