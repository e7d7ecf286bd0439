"""Every benchmark, one table: ``./run bench all``.

Runs each bench under ``bench/`` as its own process (one at a time: the machine's
cores go to one Spark job), keeps its output in ``--log-dir`` and prints one table:
what was measured, the figure, the target, and whether the target is met; for each
target not met, the bench's own per-batch split of the time follows. A bench
that fails (its exit status, e.g. a count that is not exactly the input) shows
``FAILED`` and makes the exit status 1.

``--quick`` runs smaller inputs (for a smoke check of the benches, not for figures).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

BENCH = os.path.dirname(os.path.abspath(__file__))
# Lines of a bench's output that say where the time goes (its per-batch split).
BREAKDOWN = re.compile(
    r"per-batch|per batch|addBatch|adapter|sink: total|fastest plain|\bprepare\b")


FORMAT_RATIO = r"ratio format/foreachBatch: ([0-9.]+)"
"""writeStream.format("sparkeos-...") against foreachBatch(exactly_once(...)), same sink."""


@dataclass(frozen=True)
class Case:
    label: str
    script: str
    args: tuple[str, ...]
    pattern: str  # the figure: first group of the last matching line
    target: float
    unit: str = ""


def cases(quick: bool) -> list[Case]:
    rows = "20000" if quick else "100000"
    file_args = ("--rows-per-batch", rows, "--batches", "3", "--repeats", "1" if quick else "3")
    ratio = r"ratio exactly_once/plain: ([0-9.]+)"
    found = []
    for fmt in ("parquet", "jsonl"):
        for partitions in ("2", "20", "200"):
            args = (*file_args, "--format", fmt, "--partitions", partitions)
            found.append(Case(f"file {fmt}, {partitions} partitions, vs fastest plain",
                              "file_sink.py", args, ratio, 1.1))
            found.append(Case(f"file {fmt}, {partitions} partitions, format vs foreachBatch",
                              "file_sink.py", args, FORMAT_RATIO, 1.1))
    for partitions in ("8", "200"):
        # Issue 50: the format's prepared transactions are Spark's partitions (the
        # server needs max_prepared_transactions >= 200: SPARKEOS_PG_MAX_PREPARED).
        pg = ("--rows-per-batch", rows, "--batches", "3", "--repeats", "1" if quick else "3",
              "--partitions", partitions, "--modes", "exactly_once,format,copy")
        found.append(Case(f"postgres, {partitions} partitions, vs plain COPY",
                          "jdbc_sink.py", pg, ratio, 1.1))
        found.append(Case(f"postgres format, {partitions} partitions, vs plain COPY",
                          "jdbc_sink.py", pg, r"ratio format/plain: ([0-9.]+)", 1.1))
    kafka = ("--records", "200000" if quick else "1000000", "--batches", "10", "--repeats",
             "1" if quick else "3", "--modes", "staged,overlap,plain,spark,format",
             "--details")
    found.append(Case("kafka staged vs plain producer", "kafka_sink.py", kafka, ratio, 1.3))
    found.append(Case("kafka staged vs Spark's Kafka sink", "kafka_sink.py", kafka,
                      r"ratio exactly_once/spark: ([0-9.]+)", 1.0))
    found.append(Case("kafka staged, overlap_commits, vs Spark's Kafka sink", "kafka_sink.py",
                      kafka, r"ratio overlap/spark: ([0-9.]+)", 1.0))
    found.append(Case("kafka format vs foreachBatch", "kafka_sink.py", kafka, FORMAT_RATIO,
                      1.1))
    kafka8 = (*kafka, "--partitions", "8", "--topic-partitions", "4")
    found.append(Case("kafka staged, 8 partitions, vs Spark's Kafka sink", "kafka_sink.py",
                      kafka8, r"ratio exactly_once/spark: ([0-9.]+)", 1.0))
    found.append(Case("kafka staged, overlap_commits, 8 partitions, vs Spark's Kafka sink",
                      "kafka_sink.py", kafka8, r"ratio overlap/spark: ([0-9.]+)", 1.0))
    # Issue 50: both routes against Spark's own Kafka sink as the partitions grow (the
    # format's participants are Spark's partitions; its commits merge into at most
    # commitParallelism Kafka transactions per batch).
    for partitions in ("2", "8", "32"):
        scaled = (*kafka[:-3], "--modes", "staged,overlap,plain,spark,format,python_floor",
                  "--details",
                  "--partitions", partitions, "--topic-partitions", min(partitions, "8",
                                                                        key=int))
        found.append(Case(f"kafka format, {partitions} partitions, vs Spark's Kafka sink",
                          "kafka_sink.py", scaled, r"ratio format/spark: ([0-9.]+)", 1.0))
        found.append(Case(f"kafka foreachBatch beside the format, {partitions} partitions, "
                          "vs Spark's Kafka sink",
                          "kafka_sink.py", scaled, r"ratio exactly_once/spark: ([0-9.]+)",
                          1.0))
        found.append(Case(f"kafka foreachBatch (overlapped, the default), {partitions} "
                          "partitions, vs Spark's Kafka sink",
                          "kafka_sink.py", scaled, r"ratio overlap/spark: ([0-9.]+)", 1.0))
    found.append(Case("file parquet, 200 partitions, format on a coalesced stream vs "
                      "foreachBatch", "file_sink.py",
                      (*file_args, "--format", "parquet", "--partitions", "200"),
                      r"ratio format coalesced/foreachBatch: ([0-9.]+)", 1.1))
    # Issue 51: Delta and Iceberg tables against delta-rs' write_deltalake and pyiceberg's
    # append of the same batches (Spark's own sinks have no release for the pinned Spark).
    for partitions in ("2", "20", "200"):
        delta = ("--rows-per-batch", rows, "--batches", "3", "--repeats",
                 "1" if quick else "3", "--partitions", partitions)
        for mode in ("exactly_once", "format"):
            found.append(Case(f"delta {mode}, {partitions} partitions, vs write_deltalake",
                              "delta_sink.py", delta,
                              rf"ratio {mode}/write_deltalake: ([0-9.]+)", 1.1))
            found.append(Case(f"iceberg {mode}, {partitions} partitions, vs pyiceberg's "
                              "append", "iceberg_sink.py", delta,
                              rf"ratio {mode}/pyiceberg_append: ([0-9.]+)", 1.1))
    found.append(Case("first batch of a fresh job, format vs foreachBatch, above Spark's "
                      "floor", "first_batch.py", ("--repeats", "1" if quick else "3"),
                      r"format above Spark's floor: ([0-9.-]+) ms", 1000, " ms"))
    for kind, target in (("classic", 25), ("connect", 50)):
        found.append(Case(f"per-batch overhead, tiny batches, {kind}", "overhead.py",
                          ("--batches", "20" if quick else "40"),
                          rf"overhead per batch: ([0-9.-]+) ms \({kind}\)", target, " ms"))
    # Issue 52: real-time mode, produce to visible (read_committed), and throughput.
    realtime = ("--seconds", "10" if quick else "30", "--warmup", "10",
                "--backlog", "200000" if quick else "1000000")
    found.append(Case("real-time exactly_once_writer, p99 latency above the 5 s epoch",
                      "realtime_latency.py", realtime,
                      r"eo p99 above the epoch: ([0-9.-]+) ms", 200, " ms"))
    found.append(Case("real-time exactly_once_writer throughput vs a plain Python "
                      "ForeachWriter", "realtime_latency.py", realtime,
                      r"ratio throughput plain/eo: ([0-9.]+)", 1.2))
    for sink in ("file", "postgres", "kafka"):
        found.append(Case(f"recovery of a decided batch, {sink}", "recovery.py",
                          ("--sink", sink, "--rows-per-batch", "20000" if quick else "50000"),
                          r"recovery of the decided batch: ([0-9.]+) ms", 1000, " ms"))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="", help="run cases whose label contains this")
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args(argv)
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="sparkeos-bench-all-")
    os.makedirs(log_dir, exist_ok=True)
    outputs: dict[tuple[str, tuple[str, ...]], tuple[int, str]] = {}
    rows: list[tuple[str, str, str, str]] = []
    missed: list[tuple[str, str]] = []
    failed = False
    for case in cases(args.quick):
        if args.only and args.only not in case.label:
            continue
        key = (case.script, case.args)
        if key not in outputs:  # one run of a bench can give several figures
            started = time.time()
            print(f"[bench all] {case.script} {' '.join(case.args)}", flush=True)
            proc = subprocess.run([sys.executable, os.path.join(BENCH, case.script),
                                   *case.args], capture_output=True, text=True)
            name = re.sub(r"[^A-Za-z0-9]+", "-", f"{case.script}-{'-'.join(case.args)}")
            with open(os.path.join(log_dir, name + ".log"), "w") as fh:
                fh.write(proc.stdout + proc.stderr)
            outputs[key] = (proc.returncode, proc.stdout)
            print(f"[bench all]   exit {proc.returncode} in {time.time() - started:.0f} s",
                  flush=True)
        code, out = outputs[key]
        matches = re.findall(case.pattern, out)
        if code != 0 or not matches:
            rows.append((case.label, "FAILED", f"<= {case.target:g}{case.unit}", "no"))
            failed = True
            continue
        figure = float(matches[-1])
        rows.append((case.label, f"{figure:g}{case.unit}", f"<= {case.target:g}{case.unit}",
                     "yes" if figure <= case.target else "NO"))
        if figure > case.target:
            missed.append((case.label, out))
    width = max(len(r[0]) for r in rows) if rows else 10
    print(f"\n{'benchmark':<{width}}  {'figure':>10}  {'target':>11}  met")
    for label, figure, target, met in rows:
        print(f"{label:<{width}}  {figure:>10}  {target:>11}  {met}")
    for label, out in missed:
        print(f"\nwhere the time goes, {label}:")
        for line in out.splitlines():
            if BREAKDOWN.search(line):
                print(f"  {line.strip()}")
    print(f"\n(logs: {log_dir}; docs/performance.md explains each figure)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
