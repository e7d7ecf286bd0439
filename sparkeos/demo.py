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
from sparkeos.core.errors import ConfigurationError
from sparkeos.core.faults import DRIVER_POINTS
from sparkeos.testing.job import JobSpec, run_job_process, write_input

CRASH_POINTS = (*DRIVER_POINTS, "kill_driver_after_first_prepare")
LOCAL_BUCKET = "sparkeos-demo"
SPARKLESS_STORES = ("gs", "abfs", "abfss", "wasb", "wasbs")
"""Stores sparkeos writes but pyspark's Hadoop does not reach (no connector jars)."""


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
                        "(recreated); 's3', 'gs', 'abfs': the checkout's local S3-compatible "
                        "store, GCS emulator or Azure Blob emulator (docker/services/s3.sh, "
                        "gcs.sh, azure.sh, started if needed). On gs:// and abfs:// Spark's "
                        "own checkpoint stays in the workdir (pyspark has no connector for "
                        "them); the commit log and the output are on the store")
    parser.add_argument("--format", action="store_true",
                        help='write through writeStream.format("sparkeos-parquet") instead '
                        "of foreachBatch(exactly_once(FileSink(...)))")
    parser.add_argument("--skip-plain", action="store_true",
                        help="do not run the plain foreachBatch comparison")
    parser.add_argument("--wire-faults", action="store_true",
                        help="with an s3a:// store: sparkeos' requests to it go through a "
                        "fault proxy (sparkeos.testing.wireproxy) that loses the replies "
                        "of a share of applied writes and answers 503 SlowDown to others "
                        "(Spark's own S3A goes to the store directly)")
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
    local_emulator = args.store in ("gs", "abfs")
    if args.store == "s3":
        from sparkeos.testing.s3a import start_local_store

        start_local_store(LOCAL_BUCKET)
        args.store = f"s3a://{LOCAL_BUCKET}/sparkeos-demo"
    elif args.store == "gs":
        from sparkeos.testing.clouds import start_local_gcs

        args.store = f"{start_local_gcs(LOCAL_BUCKET)}/sparkeos-demo"
    elif args.store == "abfs":
        from sparkeos.testing.clouds import start_local_azure

        args.store = f"{start_local_azure(LOCAL_BUCKET)}/sparkeos-demo"
    scheme = args.store.split("://")[0] if args.store and "://" in args.store else ""
    proxy = None
    if scheme in ("s3", "s3a", "s3n"):
        from sparkeos.testing.s3a import s3a_spark_conf

        spark_conf = s3a_spark_conf()  # Spark's checkpoint there too, through S3A
        if args.wire_faults:
            proxy = _fault_proxy()
    elif args.wire_faults:
        parser.error("--wire-faults needs an s3a:// store (--store s3)")
    elif scheme == "gs" and local_emulator:
        from sparkeos.testing.clouds import gcs_spark_conf

        # Google's connector for Hadoop, fetched from Maven Central: Spark's checkpoint
        # on the store too. Without it, Spark's checkpoint stays in the workdir.
        try:
            spark_conf = gcs_spark_conf(os.environ["STORAGE_EMULATOR_HOST"])
        except ConfigurationError as exc:
            say(f"(Spark's checkpoint stays in the workdir: {exc})")
    store = _fresh_store(args.store) if args.store else args.workdir
    # Spark reaches gs:// and abfs:// only through connectors pyspark does not ship:
    # without them its checkpoint stays local, sparkeos' commit log goes on the store.
    spark_store = args.workdir if scheme in SPARKLESS_STORES and not spark_conf else store
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
                          "kwargs": {"path": f"{spark_store}/out-plain"}}))
    for label, mode, sink in plans:
        route = "format" if args.format and mode == "exactly_once" else "foreachBatch"
        say(f"{label}" + (' (writeStream.format("sparkeos-parquet"))'
                          if route == "format" else "") + ":")
        log = ({"checkpoint_location": f"{store}/checkpoint-{mode}"}
               if spark_store != store and route == "foreachBatch" else {})
        spec = JobSpec(input=os.path.join(args.workdir, "input"),
                       checkpoint=f"{spark_store}/checkpoint-{mode}", master=args.master,
                       sink=sink, name="demo", mode=mode, connect=args.connect,
                       spark_conf=spark_conf, route=route, settings=log)
        started = time.monotonic()
        crashes, runs = _run_with_crashes(spec, schedule, say)
        table = read_output(exactly if mode == "exactly_once" else f"{spark_store}/out-plain")
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
        endpoint = (os.environ.get("SPARKEOS_DEMO_STORE_ENDPOINT")
                    or os.environ["AWS_ENDPOINT_URL_S3"])
        where = (f"AWS_ENDPOINT_URL_S3={endpoint} "
                 "AWS_ACCESS_KEY_ID=sparkeos AWS_SECRET_ACCESS_KEY=sparkeos ")
    if local_emulator:
        where += " ".join(f"{name}='{os.environ[name]}'" for name in (
            "STORAGE_EMULATOR_HOST", "AZURE_STORAGE_CONNECTION_STRING") if name in os.environ)
        where += " " if where else ""
    log_root = store if not args.format else spark_store
    say(f"inspect: {where}sparkeos status {log_root}/checkpoint-exactly_once")
    eo = outcomes[-1]
    hurt = True
    if proxy is not None:
        proxy.stop()
        injected = [action for action, _, _ in proxy.injected]
        say(f"wire faults: {injected.count('lost_reply')} replies lost after the store "
            f"applied the write, {injected.count('slow_down')} answered 503 SlowDown, of "
            f"{len(proxy.requests)} requests")
        hurt = bool(injected)
    if (eo.duplicates == 0 and eo.missing == 0 and eo.output == eo.input and eo.crashes >= 1
            and hurt):
        say(f"exactly-once: verified input={eo.input} output={eo.output} duplicates=0 missing=0")
        return 0
    say(f"exactly-once: FAILED input={eo.input} output={eo.output} duplicates={eo.duplicates} "
        f"missing={eo.missing} crashes={eo.crashes}")
    return 1


def _fault_proxy() -> Any:
    """A fault proxy before the S3 endpoint of this process (and its children, which
    inherit ``AWS_ENDPOINT_URL_S3``): a fifth of conditional writes and a tenth of other
    writes lose their reply after the store applied them, 5 % of requests get ``503
    SlowDown``."""
    from sparkeos.testing.wireproxy import LOST_REPLY, SLOW_DOWN, Fault, FaultProxy

    direct = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not direct or not direct.startswith("http://"):
        raise SystemExit("--wire-faults: set AWS_ENDPOINT_URL_S3 to the store's http:// "
                         "endpoint (or use --store s3)")
    proxy = FaultProxy(direct).start()
    os.environ["SPARKEOS_DEMO_STORE_ENDPOINT"] = direct
    proxy.add(Fault(LOST_REPLY, method="PUT", conditional=True, fraction=0.2))
    proxy.add(Fault(LOST_REPLY, method="PUT", conditional=False, fraction=0.1))
    proxy.add(Fault(SLOW_DOWN, fraction=0.05, seed=38))
    os.environ["AWS_ENDPOINT_URL_S3"] = proxy.endpoint
    return proxy


def _fresh_store(uri: str) -> str:
    """``uri`` emptied (the demo's outputs and checkpoints only)."""
    from sparkeos.core.storage.registry import split_uri

    files, path = split_uri(uri)
    files.delete(path)
    files.makedirs(path)
    return files.uri(path)


if __name__ == "__main__":
    sys.exit(main())
