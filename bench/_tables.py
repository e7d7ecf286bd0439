"""The loop the table benchmarks share (``delta_sink.py``, ``iceberg_sink.py``): the
same input (``file_sink.py``'s: one Parquet file per micro-batch,
``trigger(availableNow=True)``), a warm-up run of each mode, then ``--repeats`` rounds
with the modes alternating; every output read back (exactly-once modes must hold each
input id once, else exit status 1); medians per batch and per query, and a last line
``ratio <mode>/<baseline>: <x>`` per exactly-once mode.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from _floor import noop_source  # bench/ is the script's directory
from _split import adapter_split
from file_sink import SCHEMA_DDL, generate_input

Result = tuple[float, list[float], list[Any]]
"""(seconds of the whole query, addBatch ms per batch, the adapter's metrics)."""


@dataclass(frozen=True)
class TableBench:
    name: str
    modes: tuple[str, ...]
    """Every mode, the exactly-once ones first; ``python_floor`` is added."""
    exactly_once: tuple[str, ...]
    baseline: str
    writer: Callable[[Any, str, str, str], tuple[Any, Any]]
    """``(source, mode, out, work) -> (DataStreamWriter, adapter or None)``."""
    count: Callable[[str, str], tuple[int, int]]
    """``(out, work) -> (rows, distinct ids)`` of the table written at ``out``."""


def parse(description: str, argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rows-per-batch", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=0,
                        help="repartition(n) the source in every mode (0: the source's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)
    if args.rows_per_batch < 1 or args.batches < 1 or args.repeats < 1:
        parser.error("--rows-per-batch, --batches and --repeats must be >= 1")
    return args


def _run_query(spark: Any, bench: TableBench, mode: str, input_dir: str, out: str,
               checkpoint: str, partitions: int, work: str) -> Result:
    source = (spark.readStream.schema(SCHEMA_DDL.format(ts_type="timestamp"))
              .option("maxFilesPerTrigger", 1).parquet(input_dir))
    if partitions > 0:
        source = source.repartition(partitions)
    if mode == "python_floor":
        spark.dataSource.register(noop_source())
        writer, adapter = source.writeStream.format("bench-noop"), None
    else:
        writer, adapter = bench.writer(source, mode, out, work)
    started = time.perf_counter()
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    add_batch = [float(p.durationMs.get("addBatch", 0)) for p in query.recentProgress
                 if p.numInputRows]
    return seconds, add_batch, list(adapter.metrics) if adapter is not None else []


def run(bench: TableBench, args: argparse.Namespace) -> int:
    from sparkeos.core.streaming.spark import local_session

    modes: Sequence[str] = (*bench.modes, "python_floor")
    work = tempfile.mkdtemp(prefix=f"sparkeos-bench-{bench.name}-")
    try:
        total = generate_input(os.path.join(work, "input"), args.batches, args.rows_per_batch)
        warmup = min(args.rows_per_batch, 20_000)
        generate_input(os.path.join(work, "warmup-input"), 2, warmup)
        print(f"input: {args.batches} batches x {args.rows_per_batch} rows = {total} rows; "
              f"partitions {args.partitions or 'source'}", flush=True)
        spark = local_session(f"sparkeos-bench-{bench.name}", master=args.master,
                              conf={"spark.ui.showConsoleProgress": "false",
                                    "spark.sql.files.openCostInBytes": "65536"})

        def one(mode: str, tag: str, input_dir: str, expected: int) -> Result:
            out, ckpt = os.path.join(work, f"out-{tag}-{mode}"), os.path.join(work, f"ck-{tag}")
            result = _run_query(spark, bench, mode, input_dir, out, ckpt, args.partitions,
                                work)
            rows, distinct = (bench.count(out, work) if mode != "python_floor"
                              else (expected, expected))
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(ckpt, ignore_errors=True)
            if mode in bench.exactly_once and not rows == distinct == expected:
                print(f"FAIL: {mode} table has {rows} rows ({distinct} distinct ids), input "
                      f"has {expected}", file=sys.stderr)
                raise SystemExit(1)
            return result

        for mode in modes:  # warm-up: JVM code paths, Python workers, imports
            one(mode, "warmup", os.path.join(work, "warmup-input"), 2 * warmup)
        results: dict[str, list[Result]] = {m: [] for m in modes}
        for r in range(args.repeats):
            for mode in [*modes[r % len(modes):], *modes[:r % len(modes)]]:
                res = one(mode, str(r), os.path.join(work, "input"), total)
                results[mode].append(res)
                print(f"  run {r + 1}/{args.repeats} {mode:<16} {res[0]:7.2f} s", flush=True)
        spark.stop()
        _report(bench, modes, results, total)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _report(bench: TableBench, modes: Sequence[str], results: dict[str, list[Result]],
            total: int) -> None:
    print("\nper-batch medians over all timed runs (ms):")
    for mode in modes:
        add = [v for res in results[mode] for v in res[1]]
        print(f"  {mode:<16} addBatch {statistics.median(add) if add else 0.0:8.1f}")
    metrics = [m for res in results[bench.exactly_once[0]] for m in res[2]
               if m.outcome == "committed"]
    if metrics:
        print(f"  {bench.exactly_once[0]} sink: {adapter_split(metrics)}")
    seconds = {m: statistics.median(res[0] for res in results[m]) for m in modes}
    print(f"\n{'mode':<16} {'rows':>10} {'seconds':>9} {'rows/s':>10}")
    for mode in modes:
        print(f"{mode:<16} {total:>10} {seconds[mode]:>9.2f} {total / seconds[mode]:>10.0f}")
    for mode in bench.exactly_once:
        print(f"ratio {mode}/{bench.baseline}: {seconds[mode] / seconds[bench.baseline]:.2f}")
