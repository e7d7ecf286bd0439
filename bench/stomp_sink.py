"""Benchmark: STOMP sinks in foreachBatch, the same messages through each, in one run.

Modes (each a full streaming query over the same pre-generated input, one output queue
per mode, same SparkSession, ActiveMQ Artemis):

* ``exactly_once``: ``exactly_once(StompSink(...))``: phase 1 stages Arrow IPC files
  (fsynced); phase 2 publishes them from Spark tasks with a duplicate ID per message.
* ``plain``: a plain foreachBatch sending with stomp.py per task (``mapInArrow``, the
  same message encoding, persistent sends, a receipt on the last); at-least-once.

Input: ``--messages`` rows (default 100,000) with bodies of ``--message-bytes`` bytes
(default 100), in ``--batches`` micro-batches (default 5, so 20,000 per batch: Artemis'
default duplicate-ID cache per address) of ``--partitions`` partitions. Wall time per
query (start -> awaitTermination) after an unmeasured warm-up on a small input; every
output queue is counted by the broker. Messages/s per mode, then
``ratio exactly_once/plain: <x>`` last.

The broker: ``--url``, else ``$SPARKEOS_STOMP_URL``, else the local Artemis of
``docker/services/artemis.sh`` (started here, stopped at the end if it was not running).

    .venv/bin/python bench/stomp_sink.py --messages 20000
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "docker", "services", "artemis.sh")
MODES = ("exactly_once", "plain")


def local_artemis() -> tuple[str, bool]:
    """(url, started_here)."""
    running = subprocess.run(["bash", SCRIPT, "status"], capture_output=True).returncode == 0
    out = subprocess.run(["bash", SCRIPT, "start"], capture_output=True, text=True)
    match = re.search(r"^stomp=(\S+)$", out.stdout, re.MULTILINE)
    if out.returncode != 0 or not match:
        raise SystemExit(f"could not start the local Artemis:\n{out.stderr}")
    return f"stomp://admin:admin@{match.group(1)}", not running


def queue_depth(queue: str) -> int:
    out = subprocess.run(["bash", SCRIPT, "queue-stat", queue], capture_output=True,
                         text=True)
    match = re.search(r"messageCount=(\d+)", out.stdout)
    return int(match.group(1)) if match else 0


def generate_input(directory: str, messages: int, batches: int, partitions: int,
                   message_bytes: int) -> None:
    os.makedirs(directory, exist_ok=True)
    files = batches * partitions
    per_file = max(1, messages // files)
    pad = "x" * max(0, message_bytes - 14)
    now = time.time() - files - 10
    written = 0
    for f in range(files):
        rows = per_file if f < files - 1 else messages - written
        ids = range(written, written + rows)
        table = pa.table({"id": pa.array(ids, pa.int64()),
                          "body": pa.array([f"{i:013d}:{pad}" for i in ids], pa.string())})
        path = os.path.join(directory, f"part-{f:05d}.parquet")
        pq.write_table(table, path, compression="none")
        os.utime(path, (now + f, now + f))
        written += rows


def batch_function(mode: str, url: str, queue: str, staging: str) -> Callable[[Any, int], None]:
    from sparkeos import exactly_once
    from sparkeos.connectors.stomp import StompSink
    from sparkeos.connectors.stomp.plain import plain_foreachbatch_writer

    if mode == "exactly_once":
        return exactly_once(StompSink(url, destination=queue, body_column="body",
                                      staging_dir=staging), name="bench-stomp")
    return plain_foreachbatch_writer(url, queue, body_column="body")


def run_query(spark: Any, mode: str, url: str, input_dir: str, files_per_batch: int,
              workdir: str) -> tuple[float, str]:
    queue = f"bench-{mode}-{uuid.uuid4().hex[:8]}"
    run_dir = tempfile.mkdtemp(prefix=f"{mode}-", dir=workdir)
    fn = batch_function(mode, url, queue, os.path.join(run_dir, "staging"))
    df = (spark.readStream.schema("id long, body string")
          .option("maxFilesPerTrigger", files_per_batch).parquet(input_dir))
    started = time.perf_counter()
    query = (df.writeStream.foreachBatch(fn)
             .option("checkpointLocation", os.path.join(run_dir, "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise SystemExit(f"{mode} query failed: {query.exception()}")
    shutil.rmtree(run_dir, ignore_errors=True)
    return seconds, queue


def purge(url: str, queue: str, expect: int) -> None:
    """Empty the output queue (the benchmark leaves nothing behind)."""
    from sparkeos.connectors.stomp.client import Endpoint, StompClient

    with StompClient(Endpoint.parse(url)) as client:
        client.subscribe(queue, "purge", "auto", {"subscription-type": "ANYCAST"})
        for _ in range(expect):
            if client.receive(10.0) is None:
                break


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--message-bytes", type=int, default=100)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--url", default=os.environ.get("SPARKEOS_STOMP_URL"))
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    url, started_here = (args.url, False) if args.url else local_artemis()
    from sparkeos.core.streaming.spark import local_session

    spark = local_session("sparkeos-bench-stomp-sink", args.master)
    workdir = tempfile.mkdtemp(prefix="sparkeos-bench-stomp-")
    try:
        warm = os.path.join(workdir, "warm")
        generate_input(warm, 2_000, 2, args.partitions, args.message_bytes)
        for mode in MODES:
            _, queue = run_query(spark, mode, url, warm, args.partitions, workdir)
            purge(url, queue, 2_000)
        data = os.path.join(workdir, "input")
        generate_input(data, args.messages, args.batches, args.partitions,
                       args.message_bytes)
        print(f"stomp_sink: {args.messages} messages of {args.message_bytes} bytes, "
              f"{args.batches} batches x {args.partitions} partitions, {url.split('@')[-1]}",
              flush=True)
        seconds: dict[str, float] = {}
        for mode in MODES:
            took, queue = run_query(spark, mode, url, data, args.partitions, workdir)
            seen = queue_depth(queue) if not args.url else None
            seconds[mode] = took
            print(f"  {mode:13s} {took:7.2f} s  {args.messages / took:10,.0f} msg/s  "
                  f"in queue: {seen if seen is not None else 'not counted'}", flush=True)
            if seen is not None and seen != args.messages:
                raise SystemExit(f"{mode}: {seen} messages in {queue}, expected "
                                 f"{args.messages}")
            purge(url, queue, args.messages)
        print(f"ratio exactly_once/plain: {seconds['exactly_once'] / seconds['plain']:.2f}")
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        if started_here:
            subprocess.run(["bash", SCRIPT, "stop"], capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
