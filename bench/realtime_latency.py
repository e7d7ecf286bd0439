"""Benchmark: latency from produce to visible, Kafka to Kafka, in one run.

Modes (each its own streaming query, in one SparkSession, one input and one output
topic per mode):

* ``eo``: ``exactly_once_writer(KafkaSink(...))`` in real-time mode
  (``trigger(realTime=--epoch)``): one Kafka transaction per partition and epoch.
* ``spark``: Spark's own Kafka sink in real-time mode (at-least-once: records are
  produced as they arrive, outside any transaction).
* ``plain``: a plain Python ForeachWriter in real-time mode, what users write without
  sparkeos (a producer per task, flushed in ``close``; at-least-once): the floor of
  any Python writer in this mode, which ``eo`` is.
* ``microbatch``: ``foreachBatch(exactly_once(KafkaSink(...)))`` with the default
  trigger (each batch starts when the one before ended: its best latency).

Each query first runs under a steady input of ``--rate`` records a second for
``--seconds`` (after ``--warmup`` seconds that are not counted): every record carries
the time it was produced, and a ``read_committed`` consumer in this process notes when
it sees it. Latency = seen - produced, p50 / p99 / max over the counted records. Then
``--backlog`` records are produced at once, and throughput is the backlog over the time
from its first record produced to its last one seen.

For ``eo``, the cost per epoch is what the writer spends in ``open`` and ``close`` (the
rows still held, the marker, the commit) per partition and epoch, measured in the tasks
(median), and the time of the transaction's open (the mark's peek, the fence, the mark:
``EpochWriter.last_epoch``), which runs on a thread beside the epoch's first rows.

Printed last: ``eo p99 above the epoch: <ms>`` (target: 200 ms), ``ratio throughput
plain/eo: <x>`` (target 1.2: the exactly-once writer keeps at least 1/1.2 of the
at-least-once Python writer's throughput) and ``ratio throughput spark/eo`` (Spark's
own sink runs in the JVM, with no Python worker between). An exactly-once record is
visible at its epoch's commit, so ``eo``'s backlog time includes up to one epoch of
waiting: a backlog many epochs long keeps that share small.

The broker: ``$SPARKEOS_KAFKA_BOOTSTRAP``, else the local broker of
``docker/services/kafka.sh`` (started here and stopped at the end if it was not running).

    .venv/bin/python bench/realtime_latency.py --seconds 30
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from _services import service  # bench/ is the script's directory
from kafka_sink import create_topic

MODES = ("eo", "plain", "spark", "microbatch")


class Visible:
    """A ``read_committed`` consumer of the output topic, on a thread: when each record
    became visible (``time.time_ns`` of this process, as the producer's stamp is)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.seen: dict[int, tuple[int, int]] = {}
        """id -> (produced ns, seen ns), the first time it was seen."""
        self.duplicates = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer({"bootstrap.servers": self.bootstrap,
                             "group.id": f"bench-{uuid.uuid4().hex}",
                             "isolation.level": "read_committed",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False,
                             "fetch.wait.max.ms": 5})
        consumer.subscribe([self.topic])
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(10_000, 0.05):
                    if msg.error() is not None:
                        continue
                    now = time.time_ns()
                    record = json.loads(msg.value())
                    if record["id"] in self.seen:
                        self.duplicates += 1
                    else:
                        self.seen[record["id"]] = (record["t"], now)
        finally:
            consumer.close()

    def wait_for(self, ids: range, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(i in self.seen for i in (ids.start, ids.stop - 1)) and \
                    sum(1 for i in ids if i in self.seen) == len(ids):
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def produce(bootstrap: str, topic: str, ids: range, rate: float | None) -> None:
    """``ids`` into ``topic``, each stamped with the time it is produced; at ``rate``
    records a second, or as fast as the producer takes them (None)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1,
                         "enable.idempotence": True})
    started = time.monotonic()
    for n, i in enumerate(ids):
        if rate is not None:
            due = started + n / rate
            while time.monotonic() < due:
                producer.poll(0)
                time.sleep(min(0.002, max(0.0, due - time.monotonic())))
        while True:
            try:
                producer.produce(topic, json.dumps({"id": i, "t": time.time_ns()}).encode(),
                                 key=str(i).encode())
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(60)


class PlainWriter:
    """A ForeachWriter without sparkeos: a producer per task, flushed in ``close``."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic

    def open(self, partition_id: int, epoch_id: int) -> bool:
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5})
        return True

    def process(self, row: Any) -> None:
        while True:
            try:
                self.producer.produce(self.topic, bytes(row["value"]), key=bytes(row["key"]))
                return
            except BufferError:
                self.producer.poll(0.01)

    def close(self, error: Any) -> None:
        self.producer.flush(60)


class TimedWriter:
    """The exactly-once writer, with the time of its ``open`` and ``close`` written per
    (partition, epoch) to a file of this task process (the bench's own measurement).
    ``trace``: also each row's id, its produce stamp and when it reached ``process``,
    with its epoch's ``open``, ``close`` start and end (``--trace``: where a record waits)."""

    def __init__(self, writer: Any, directory: str, trace: bool = False) -> None:
        self.writer, self.directory, self.trace = writer, directory, trace

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self.opened_ns = time.time_ns()
        self.rows: list[tuple[int, int, int]] = []
        started = time.perf_counter()
        opened = self.writer.open(partition_id, epoch_id)
        self.open_ms = (time.perf_counter() - started) * 1000
        return bool(opened)

    def process(self, row: Any) -> None:
        if self.trace:
            record = json.loads(bytes(row["value"]))
            self.rows.append((record["id"], record["t"], time.time_ns()))
        self.writer.process(row)

    def close(self, error: Any) -> None:
        close_ns = time.time_ns()
        started = time.perf_counter()
        self.writer.close(error)
        close_ms = (time.perf_counter() - started) * 1000
        closed_ns = time.time_ns()
        ahead = self.writer.last_epoch.get("open_ms", 0.0)
        with open(os.path.join(self.directory, f"{os.getpid()}.txt"), "a") as fh:
            fh.write(f"{self.open_ms:.2f} {close_ms:.2f} {ahead:.2f}\n")
        if self.trace and error is None:
            with open(os.path.join(self.directory, f"{os.getpid()}.trace"), "a") as fh:
                fh.writelines(f"{i} {t} {arrived} {self.opened_ns} {close_ns} {closed_ns}\n"
                              for i, t, arrived in self.rows)


def where_records_wait(timings: str, seen: dict[int, tuple[int, int]],
                       counted: set[int]) -> str:
    """From ``--trace``'s files: a record's latency split into its parts, p50 / p99 of
    each, and the mean of each over the records slower than the p99 (ms)."""
    parts: list[tuple[float, ...]] = []
    for path in glob.glob(os.path.join(timings, "*.trace")):
        with open(path) as fh:
            for line in fh:
                i, t, arrived, opened, close, closed = (int(v) for v in line.split())
                if i not in counted or i not in seen:
                    continue
                visible = seen[i][1]
                parts.append(((visible - t) / 1e6, max(0, opened - t) / 1e6,
                              (arrived - max(opened, t)) / 1e6, (close - arrived) / 1e6,
                              (closed - close) / 1e6, (visible - closed) / 1e6))
    if not parts:
        return "no trace"
    names = ("total", "produced to its epoch's open", "to process", "to the epoch's close",
             "close (commit)", "close to seen")
    slowest = sorted(parts)[int(0.99 * len(parts)):]
    return "; ".join(
        f"{name} p50 {percentile([p[k] for p in parts], 0.5):.0f} p99 "
        f"{percentile([p[k] for p in parts], 0.99):.0f} slowest-1% mean "
        f"{statistics.mean(p[k] for p in slowest):.0f}" for k, name in enumerate(names))


def start_query(spark: Any, mode: str, bootstrap: str, source: str, target: str,
                checkpoint: str, epoch: str, timings: str, trace: bool = False) -> Any:
    from sparkeos import exactly_once, exactly_once_writer
    from sparkeos.connectors.kafka import KafkaSink

    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", source).option("startingOffsets", "earliest").load()
          .selectExpr("key", "value"))
    sink = KafkaSink(bootstrap, topic=target, key_column="key", value_column="value")
    if mode == "eo":
        writer = TimedWriter(exactly_once_writer(sink, "bench", checkpoint_location=checkpoint),
                             timings, trace)
        stream = df.writeStream.foreach(writer).outputMode("update").trigger(realTime=epoch)
    elif mode == "plain":
        stream = (df.writeStream.foreach(PlainWriter(bootstrap, target)).outputMode("update")
                  .trigger(realTime=epoch))
    elif mode == "spark":
        stream = (df.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                  .option("topic", target).outputMode("update").trigger(realTime=epoch))
    else:
        stream = df.writeStream.foreachBatch(exactly_once(sink, name="bench",
                                                          checkpoint_location=checkpoint))
    return stream.option("checkpointLocation", checkpoint).start()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_mode(spark: Any, mode: str, bootstrap: str, args: argparse.Namespace,
             workdir: str) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]
    source, target = f"bench-rt-in-{mode}-{tag}", f"bench-rt-out-{mode}-{tag}"
    for topic in (source, target):
        create_topic(bootstrap, topic, args.partitions)
    timings = os.path.join(workdir, f"timings-{mode}")
    os.makedirs(timings)
    query = start_query(spark, mode, bootstrap, source, target,
                        os.path.join(workdir, f"checkpoint-{mode}"), args.epoch, timings,
                        args.trace)
    visible = Visible(bootstrap, target)
    try:
        steady = range(0, int(args.rate * (args.warmup + args.seconds)))
        produce(bootstrap, source, steady, args.rate)
        if not visible.wait_for(steady, 120):
            raise SystemExit(f"{mode}: {len(steady) - len(visible.seen)} records not visible")
        counted = [(seen - produced) / 1e6 for i, (produced, seen) in visible.seen.items()
                   if i >= int(args.rate * args.warmup) and i in steady]
        if args.trace and mode == "eo":
            print("eo, where a record waits (ms): " + where_records_wait(
                timings, dict(visible.seen), set(range(int(args.rate * args.warmup),
                                                       steady.stop))), flush=True)
        backlog = range(steady.stop, steady.stop + args.backlog)
        started = time.time_ns()
        produce(bootstrap, source, backlog, None)
        if not visible.wait_for(backlog, 300):
            raise SystemExit(f"{mode}: backlog not visible")
        last = max(visible.seen[i][1] for i in backlog)
        throughput = args.backlog / ((last - started) / 1e9)
    finally:
        visible.stop()
        query.stop()
    result = {"mode": mode, "p50": percentile(counted, 0.5), "p99": percentile(counted, 0.99),
              "max": max(counted), "records": len(counted), "throughput": throughput,
              "duplicates": visible.duplicates}
    lines = []
    for path in glob.glob(os.path.join(timings, "*.txt")):
        with open(path) as fh:
            lines += [line.split() for line in fh]
    if lines:
        result["open_ms"] = statistics.median(float(line[0]) for line in lines)
        result["close_ms"] = statistics.median(float(line[1]) for line in lines)
        result["ahead_ms"] = statistics.median(float(line[2]) for line in lines)
        result["epochs"] = len(lines)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epoch", default="5 seconds", help="real-time mode's epoch")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--trace", action="store_true",
                        help="eo: trace each record's way (slows the backlog; for figures "
                        "of where a record waits, not of throughput)")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")

    from sparkeos.connectors.kafka import spark_kafka_jars
    from sparkeos.core.streaming.spark import local_session

    bootstrap = service("kafka.sh", "SPARKEOS_KAFKA_BOOTSTRAP", "bootstrap")
    epoch_ms = int(float(args.epoch.split()[0]) * 1000)
    spark = local_session("sparkeos-bench-realtime", f"local[{args.partitions + 2}]", {
        "spark.jars": ",".join(spark_kafka_jars()),
        "spark.sql.streaming.realTimeMode.minBatchDuration": str(min(epoch_ms, 5000))})
    print(f"broker {bootstrap}; Spark {spark.version}; epoch {args.epoch}; {args.rate:.0f} "
          f"records/s for {args.seconds:.0f} s after {args.warmup:.0f} s; backlog "
          f"{args.backlog}; {args.partitions} partitions", flush=True)
    workdir = tempfile.mkdtemp(prefix="sparkeos-bench-rt-")
    results = {}
    try:
        for mode in modes:
            results[mode] = r = run_mode(spark, mode, bootstrap, args, workdir)
            cost = (f"; per partition and epoch: open {r['open_ms']:.1f} ms (the "
                    f"transaction's {r['ahead_ms']:.1f} ms, ahead of the rows), close "
                    f"{r['close_ms']:.1f} ms (median of {r['epochs']})" if "open_ms" in r
                    else "")
            print(f"{mode:<10} latency p50 {r['p50']:7.0f} ms  p99 {r['p99']:7.0f} ms  max "
                  f"{r['max']:7.0f} ms ({r['records']} records); throughput "
                  f"{r['throughput']:8.0f} records/s; duplicates seen {r['duplicates']}{cost}",
                  flush=True)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if "eo" in results:
        print(f"eo p99 above the epoch: {results['eo']['p99'] - epoch_ms:.0f} ms")
    if "eo" in results and "plain" in results:
        print(f"ratio throughput plain/eo: "
              f"{results['plain']['throughput'] / results['eo']['throughput']:.2f}")
    if "eo" in results and "spark" in results:
        print(f"ratio throughput spark/eo: "
              f"{results['spark']['throughput'] / results['eo']['throughput']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
