"""``sparkeos demo``: exactly-once under repeated driver crashes, on local Spark + files.

The demo writes numbered input files, then runs the same streaming query twice:
through ``exactly_once(FileSink(...))`` and through a plain ``foreachBatch`` write.
Each is killed at random protocol points (a real ``os._exit`` / ``SIGKILL`` of the
driver process) and restarted from its checkpoint until all input is consumed. Then
it counts what a reader of each output directory sees.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkeos.connectors.file import read_output
from sparkeos.core.faults import DRIVER_POINTS
from sparkeos.testing.job import JobSpec, run_job_process, write_input

CRASH_POINTS = (*DRIVER_POINTS, "kill_driver_after_first_prepare")
LOCAL_BUCKET = "sparkeos-demo"


@dataclass
class Outcome:
    label: str
    crashes: int
    runs: int
    input: int
    output: int
    duplicates: int
    missing: int
    seconds: float


def _count(label: str, expected: list[int], visible: list[int], crashes: int, runs: int,
           seconds: float) -> Outcome:
    counts = Counter(visible)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    missing = len(set(expected) - set(counts))
    return Outcome(label, crashes, runs, len(expected), len(visible), duplicates, missing,
                   seconds)


def _run_with_crashes(spec: JobSpec, schedule: list[tuple[str, int]],
                      say: Callable[[str], None]) -> tuple[int, int]:
    crashes = runs = 0
    for point, batch in schedule:
        runs += 1
        result = run_job_process(spec, fault=f"{point}@{batch}")
        if result.crashed:
            crashes += 1
            where = "after its write" if spec.mode == "plain" else f"at {point}"
            say(f"  run {runs}: driver killed in batch {batch} {where}; restarting")
        elif result.returncode != 0:
            raise SystemExit(f"demo job failed unexpectedly:\n{result.tail()}")
        else:
            say(f"  run {runs}: finished before the planned crash at batch {batch}")
            return crashes, runs
    for _ in range(3):
        runs += 1
        result = run_job_process(spec)
        if result.returncode == 0:
            say(f"  run {runs}: completed")
            return crashes, runs
        say(f"  run {runs}: exited with {result.returncode}; restarting")
    raise SystemExit(f"demo job did not complete:\n{result.tail()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkeos demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default=os.path.join(os.getcwd(), "sparkeos-demo"),
                        help="where input, outputs and checkpoints go (recreated)")
    parser.add_argument("--batches", type=int, default=8, help="input files = micro-batches")
    parser.add_argument("--rows", type=int, default=500, help="rows per batch")
    parser.add_argument("--crashes", type=int, default=4, help="driver kills per query")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--connect", action="store_true",
                        help="run the queries through Spark Connect (a local Connect "
                        "server; needs sparkeos[connect])")
    parser.add_argument("--master", default="local[2]",
                        help="Spark master: local[N], or a cluster, e.g. spark://host:7077 "
                        "(the workdir must then be reachable from every executor, or give "
                        "--store)")
    parser.add_argument("--store", default=None,
                        help="where outputs and checkpoints go instead of the workdir, e.g. "
                        "hdfs://namenode:8020/sparkeos-demo or s3a://bucket/sparkeos-demo "
                        "(recreated); 's3': the checkout's local S3-compatible store "
                        "(docker/services/s3.sh, started if needed)")
    parser.add_argument("--format", action="store_true",
                        help='write through writeStream.format("sparkeos-parquet") instead '
                        "of foreachBatch(exactly_once(FileSink(...)))")
    parser.add_argument("--skip-plain", action="store_true",
                        help="do not run the plain foreachBatch comparison")
    args = parser.parse_args(argv)
    if args.crashes >= args.batches:
        parser.error("--crashes must be smaller than --batches")

    def say(text: str) -> None:
        print(text, flush=True)

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    rng = random.Random(seed)
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    spark_conf: dict[str, str] = {}
    if args.store == "s3":
        from sparkeos.testing.s3a import start_local_store

        start_local_store(LOCAL_BUCKET)
        args.store = f"s3a://{LOCAL_BUCKET}/sparkeos-demo"
    if args.store and args.store.split("://")[0] in ("s3", "s3a", "s3n"):
        from sparkeos.testing.s3a import s3a_spark_conf

        spark_conf = s3a_spark_conf()  # Spark's checkpoint there too, through S3A
    store = _fresh_store(args.store) if args.store else args.workdir
    say(f"sparkeos demo: {args.batches} batches x {args.rows} rows, {args.crashes} driver "
        f"kills per query, seed {seed}, workdir {args.workdir}"
        + (f", outputs and checkpoints in {store}" if args.store else "")
        + f", master {args.master}" + (", through Spark Connect" if args.connect else ""))
    ids = [list(range(b * args.rows, (b + 1) * args.rows)) for b in range(args.batches)]
    expected = write_input(os.path.join(args.workdir, "input"), ids)
    # Crash in distinct, increasing batches so every run makes progress.
    batches = sorted(rng.sample(range(args.batches), args.crashes))
    schedule = [(rng.choice(CRASH_POINTS), b) for b in batches]

    outcomes = []
    exactly = f"{store}/out-exactly-once"
    plans: list[tuple[str, str, dict[str, Any]]] = [(
        "sparkeos exactly-once", "exactly_once",
        {"format": "sparkeos-parquet", "options": {"path": exactly}} if args.format else
        {"factory": "sparkeos.connectors.file:FileSink", "kwargs": {"path": exactly}})]
    if not args.skip_plain:
        plans.insert(0, ("plain foreachBatch", "plain",
                         {"factory": "sparkeos.testing.job:plain_file_writer",
                          "kwargs": {"path": f"{store}/out-plain"}}))
    for label, mode, sink in plans:
        route = "format" if args.format and mode == "exactly_once" else "foreachBatch"
        say(f"{label}" + (' (writeStream.format("sparkeos-parquet"))'
                          if route == "format" else "") + ":")
        spec = JobSpec(input=os.path.join(args.workdir, "input"),
                       checkpoint=f"{store}/checkpoint-{mode}", master=args.master,
                       sink=sink, name="demo", mode=mode, connect=args.connect,
                       spark_conf=spark_conf, route=route)
        started = time.monotonic()
        crashes, runs = _run_with_crashes(spec, schedule, say)
        table = read_output(exactly if mode == "exactly_once" else f"{store}/out-plain")
        visible = table.column("id").to_pylist() if table.num_rows else []
        outcomes.append(_count(label, expected, visible, crashes, runs,
                               time.monotonic() - started))

    say("")
    say(f"{'mode':<24}{'crashes':>8}{'runs':>6}{'input':>8}{'output':>8}"
        f"{'duplicates':>12}{'missing':>9}{'seconds':>9}")
    for o in outcomes:
        say(f"{o.label:<24}{o.crashes:>8}{o.runs:>6}{o.input:>8}{o.output:>8}"
            f"{o.duplicates:>12}{o.missing:>9}{o.seconds:>9.1f}")
    where = ""
    if store.startswith(f"s3a://{LOCAL_BUCKET}/") and os.environ.get("AWS_ENDPOINT_URL_S3"):
        where = (f"AWS_ENDPOINT_URL_S3={os.environ['AWS_ENDPOINT_URL_S3']} "
                 "AWS_ACCESS_KEY_ID=sparkeos AWS_SECRET_ACCESS_KEY=sparkeos ")
    say(f"inspect: {where}sparkeos status {store}/checkpoint-exactly_once")
    eo = outcomes[-1]
    if eo.duplicates == 0 and eo.missing == 0 and eo.output == eo.input and eo.crashes >= 1:
        say(f"exactly-once: verified input={eo.input} output={eo.output} duplicates=0 missing=0")
        return 0
    say(f"exactly-once: FAILED input={eo.input} output={eo.output} duplicates={eo.duplicates} "
        f"missing={eo.missing} crashes={eo.crashes}")
    return 1


def _fresh_store(uri: str) -> str:
    """``uri`` emptied (the demo's outputs and checkpoints only)."""
    from sparkeos.core.files import split_uri

    files, path = split_uri(uri)
    files.delete(path)
    files.makedirs(path)
    return files.uri(path)


if __name__ == "__main__":
    sys.exit(main())
