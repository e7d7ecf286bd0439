"""Benchmark: reading a STOMP queue into Spark, the same messages through each, one run.

Modes (each drains its own queue holding the same messages, ActiveMQ Artemis, same
SparkSession, the batch written as Parquet by ``df.write`` in foreachBatch):

* ``exactly_once``: ``stomp_source(...)``: pulls with ``client-individual`` ack in the
  source runner, spools each pull durably (fsync), executors read the spool, ACKs
  (confirmed by a receipt) after Spark committed the batch.
* ``plain``: what users write without sparkeos: a foreachBatch on a file-tick source
  that receives up to a batch of messages with stomp.py, writes them, then
  acknowledges them (at-least-once: a crash between the two writes them twice).

``--messages`` (default 100,000) of ``--message-bytes`` bytes (default 100), batches of
``--batch`` messages (default 10,000). Each queue is filled before its query starts
(not measured); the wall time (start -> awaitTermination) includes the final empty pull
of both modes (``--poll-timeout`` seconds). Messages/s per mode, the queues checked
empty, then ``ratio exactly_once/plain: <x>`` last.

    .venv/bin/python bench/stomp_source.py --messages 20000
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from stomp_sink import SCRIPT, local_artemis, queue_depth  # type: ignore[import-not-found]

MODES = ("exactly_once", "plain")


def fill(url: str, queue: str, messages: int, message_bytes: int) -> None:
    from sparkeos.connectors.stomp.client import Endpoint, StompClient

    pad = b"x" * max(0, message_bytes - 14)
    with StompClient(Endpoint.parse(url), timeout_s=120.0) as client:
        client.send_all(((queue, b"%013d:" % i + pad,
                          {"persistent": "true", "destination-type": "ANYCAST"})
                         for i in range(messages)), f"fill {queue}")


def count_parquet(path: str) -> int:
    import pyarrow.dataset as ds

    if not os.path.isdir(path):
        return 0
    return int(ds.dataset(path, format="parquet").count_rows())


def run_exactly_once(spark: Any, url: str, queue: str, out: str, workdir: str,
                     batch: int, poll_timeout: float) -> Any:
    from sparkeos.connectors.stomp import stomp_source

    df = stomp_source(spark, url, queue, spool_dir=os.path.join(workdir, "spool"),
                      max_batch_messages=batch, poll_timeout_s=poll_timeout)

    def write(batch_df: Any, batch_id: int) -> None:
        batch_df.select("message_id", "body").write.mode("append").parquet(out)

    return (df.writeStream.foreachBatch(write)
            .option("checkpointLocation", os.path.join(workdir, "checkpoint"))
            .trigger(availableNow=True).start())


def run_plain(spark: Any, url: str, queue: str, out: str, workdir: str, batch: int,
              poll_timeout: float, messages: int) -> Any:
    from sparkeos.connectors.stomp.client import Endpoint, StompClient

    ticks = os.path.join(workdir, "ticks")
    os.makedirs(ticks)
    for i in range(messages // batch + 2):
        with open(os.path.join(ticks, f"{i:05d}.txt"), "w") as fh:
            fh.write("tick\n")
    endpoint = Endpoint.parse(url)
    client = StompClient(endpoint, timeout_s=120.0).connect()
    client.subscribe(queue, "plain", "client-individual", {"subscription-type": "ANYCAST",
                                                            "consumer-window-size": "-1"})

    def consume(_df: Any, batch_id: int) -> None:
        frames = []
        while len(frames) < batch:
            frame = client.receive(poll_timeout if not frames else 0.2)
            if frame is None:
                break
            frames.append(frame)
        if not frames:
            return
        rows = [(f.headers["message-id"], f.body) for f in frames]
        spark.createDataFrame(rows, "message_id string, body binary").write.mode(
            "append").parquet(out)
        receipt = client.new_receipt()
        for i, f in enumerate(frames):
            client.ack(f.headers["ack"], receipt=receipt if i == len(frames) - 1 else None)
        client.wait_receipt(receipt, "acks")

    stream = spark.readStream.option("maxFilesPerTrigger", 1).text(ticks)
    query = (stream.writeStream.foreachBatch(consume)
             .option("checkpointLocation", os.path.join(workdir, "checkpoint"))
             .trigger(availableNow=True).start())
    query.sparkeos_client = client  # closed by the caller
    return query


def run(spark: Any, mode: str, url: str, messages: int, message_bytes: int, batch: int,
        poll_timeout: float, root: str) -> tuple[float, int, str]:
    queue = f"bench-src-{mode}-{uuid.uuid4().hex[:8]}"
    workdir = tempfile.mkdtemp(prefix=f"{mode}-", dir=root)
    out = os.path.join(workdir, "out")
    fill(url, queue, messages, message_bytes)
    started = time.perf_counter()
    if mode == "exactly_once":
        query = run_exactly_once(spark, url, queue, out, workdir, batch, poll_timeout)
    else:
        query = run_plain(spark, url, queue, out, workdir, batch, poll_timeout, messages)
    query.awaitTermination()
    seconds = time.perf_counter() - started
    client = getattr(query, "sparkeos_client", None)
    if client is not None:
        client.close()
    if query.exception() is not None:
        raise SystemExit(f"{mode} query failed: {query.exception()}")
    written = count_parquet(out)
    shutil.rmtree(workdir, ignore_errors=True)
    return seconds, written, queue


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--message-bytes", type=int, default=100)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--poll-timeout", type=float, default=1.0)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args(argv)

    url, started_here = local_artemis()
    from sparkeos.core.streaming.spark import local_session

    spark = local_session("sparkeos-bench-stomp-source", args.master)
    root = tempfile.mkdtemp(prefix="sparkeos-bench-stomp-source-")
    try:
        for mode in MODES:  # warm-up
            run(spark, mode, url, 2_000, args.message_bytes, 1_000, args.poll_timeout, root)
        print(f"stomp_source: {args.messages} messages of {args.message_bytes} bytes, "
              f"batches of {args.batch}, {url.split('@')[-1]}", flush=True)
        seconds: dict[str, float] = {}
        for mode in MODES:
            took, written, queue = run(spark, mode, url, args.messages, args.message_bytes,
                                       args.batch, args.poll_timeout, root)
            left = queue_depth(queue)
            seconds[mode] = took
            print(f"  {mode:13s} {took:7.2f} s  {args.messages / took:10,.0f} msg/s  "
                  f"written {written}, left in queue {left}", flush=True)
            if written != args.messages or left:
                raise SystemExit(f"{mode}: wrote {written} of {args.messages}, {left} left")
        print(f"ratio exactly_once/plain: {seconds['exactly_once'] / seconds['plain']:.2f}")
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
        if started_here:
            subprocess.run(["bash", SCRIPT, "stop"], capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
