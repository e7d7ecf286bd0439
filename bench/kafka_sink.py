"""Benchmark: Kafka sinks in foreachBatch, the same records through each, in one run.

Modes (each a full streaming query over the same pre-generated input, one output topic
per mode, same SparkSession):

* ``staged``: ``exactly_once(KafkaSink(..., mode="staged"), overlap_commits=False)``:
  phase 1 stages Arrow IPC files, fsynced; phase 2 publishes them in Kafka
  transactions with the marker, from Spark tasks, before the batch returns to Spark.
* ``overlap``: ``staged`` as a classic session runs it by default (``overlap_commits``
  unset): each batch's phase 2 runs on a driver thread beside the next batch's phase 1
  (the time runs until the last batch's records are committed: ``flush()``).
* ``direct``: ``at_least_once(KafkaSink(..., mode="direct"))``: each task produces in a
  Kafka transaction and commits with its marker (replays of a batch are skipped).
* ``plain``: a plain foreachBatch with a non-transactional idempotent confluent-kafka
  producer per task (``mapInArrow``, the same record encoding); at-least-once.
* ``spark``: Spark's own Kafka sink, ``df.write.format("kafka")`` in foreachBatch
  (needs the connector jars: ``spark_kafka_jars()``); at-least-once.
* ``format``: ``writeStream.format("sparkeos-kafka")``, the staged sink through Spark's
  Python streaming writer (phase 2 from the commit worker, not from tasks); exactly-once.
* ``python_floor``: a Python streaming sink that writes nothing (``bench/_floor.py``):
  Spark's own cost of the format route, which no Python sink can go below; ``ratio
  format/python floor`` is the format's cost above it.

Input: ``--records`` rows (default 1,000,000) of ``id long, value binary`` with values
of ``--record-bytes`` bytes (default 100), in ``--batches`` micro-batches of
``--partitions`` partitions. Every query's wall time (start -> awaitTermination) is
measured after an unmeasured warm-up round on one batch of the same size; with ``--repeats`` > 1
the mode order rotates and medians are reported. Records/s and MB/s (record values,
10^6 bytes) per mode, then ``ratio direct/plain`` and, last,
``ratio exactly_once/plain: <x>`` (staged wall time / plain wall time).

The broker: ``--bootstrap``, else ``$SPARKEOS_KAFKA_BOOTSTRAP``, else the local broker
of ``docker/services/kafka.sh`` (started here and stopped at the end if it was not
running). Results on a shared machine are noisy: compare ratios within one run.

    .venv/bin/python bench/kafka_sink.py --records 200000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from _floor import noop_source  # bench/ is the script's directory
from _services import service

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("staged", "overlap", "direct", "plain", "spark", "format", "python_floor")
COMMITTERS: list[int] = []
"""``--commit-parallelism``: the format's ``sparkeos.commitParallelism`` (empty: the
default), which also bounds its Kafka transactions per batch."""


@dataclass
class Result:
    mode: str
    records: int
    seconds: float
    visible: int | None = None


# -- input -----------------------------------------------------------------------------------
def generate_input(directory: str, records: int, batches: int, partitions: int,
                   record_bytes: int) -> int:
    """One Parquet file per (batch, partition); returns the total value bytes."""
    os.makedirs(directory, exist_ok=True)
    files = batches * partitions
    per_file = max(1, records // files)
    pad = os.urandom(record_bytes).hex()[: max(0, record_bytes - 14)].encode()
    now = time.time() - files - 10
    total = 0
    written = 0
    for f in range(files):
        rows = per_file if f < files - 1 else records - written
        ids = range(written, written + rows)
        values = [b"%013d:" % i + pad for i in ids]
        total += sum(len(v) for v in values)
        table = pa.table({"id": pa.array(ids, pa.int64()), "value": pa.array(values, pa.binary())})
        path = os.path.join(directory, f"part-{f:05d}.parquet")
        pq.write_table(table, path, compression="none")
        os.utime(path, (now + f, now + f))
        written += rows
    return total


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)


def count_committed(bootstrap: str, topic: str, expect: int, timeout_s: float = 120) -> int:
    """How many records a read_committed consumer sees in ``topic``."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        pending = set(parts)
        seen = 0
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                err = msg.error()
                if err is None:
                    seen += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
        return seen
    finally:
        consumer.close()


# -- the modes -----------------------------------------------------------------------------------
def batch_function(mode: str, bootstrap: str, topic: str, staging: str, fsync: bool,
                   producer_config: dict[str, Any]) -> Callable[[Any, int], None]:
    from sparkeos import at_least_once, exactly_once
    from sparkeos.connectors.kafka import KafkaSink
    from sparkeos.connectors.kafka.plain import plain_foreachbatch_writer

    if mode == "staged":
        sink = KafkaSink(bootstrap, topic=topic, value_column="value", mode="staged",
                         staging_dir=staging, fsync=fsync, producer_config=producer_config)
        return exactly_once(sink, name="bench-staged", overlap_commits=False)
    if mode == "overlap":
        sink = KafkaSink(bootstrap, topic=topic, value_column="value", mode="staged",
                         staging_dir=staging, fsync=fsync, producer_config=producer_config)
        return exactly_once(sink, name="bench-overlap")
    if mode == "direct":
        sink = KafkaSink(bootstrap, topic=topic, value_column="value", mode="direct",
                         producer_config=producer_config)
        return at_least_once(sink, name="bench-direct")
    if mode == "plain":
        return plain_foreachbatch_writer(bootstrap, topic, value_column="value",
                                         producer_config=producer_config)

    def spark_sink(df: Any, batch_id: int) -> None:
        (df.select("value").write.format("kafka")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).save())

    return spark_sink


def run_query(spark: Any, mode: str, input_dir: str, files_per_batch: int, bootstrap: str,
              workdir: str, fsync: bool, topic_partitions: int,
              producer_config: dict[str, Any], details: bool = False) -> tuple[float, str]:
    topic = f"bench-{mode}-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, topic_partitions)
    run_dir = tempfile.mkdtemp(prefix=f"{mode}-", dir=workdir)
    fn = None if mode in ("format", "python_floor") else batch_function(
        mode, bootstrap, topic, os.path.join(run_dir, "staging"), fsync, producer_config)
    df = (spark.readStream.schema("id long, value binary")
          .option("maxFilesPerTrigger", files_per_batch).parquet(input_dir))
    started = time.perf_counter()
    if mode == "python_floor":
        spark.dataSource.register(noop_source())
        writer = df.select("value").writeStream.format("bench-noop")
    elif mode == "format":
        writer = (df.select("value").writeStream.format("sparkeos-kafka")
                  .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
                  .option("sparkeos.stagingDir", os.path.join(run_dir, "staging"))
                  .option("sparkeos.fsync", str(fsync).lower())
                  .options(**({"sparkeos.commitParallelism": str(COMMITTERS[0])}
                              if COMMITTERS else {}))
                  .options(**{f"kafka.{k}": str(v) for k, v in producer_config.items()}))
    else:
        writer = df.writeStream.foreachBatch(fn)
    query = (writer.option("checkpointLocation", os.path.join(run_dir, "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    flush = getattr(fn, "flush", None)
    if callable(flush):
        flush()  # overlap_commits: until the last batch's records are committed
    seconds = time.perf_counter() - started
    visible = [m.visible_ms for m in getattr(fn, "metrics", [])]
    if visible:
        print(f"    {mode}: visible latency per batch (start to committed), median "
              f"{statistics.median(visible):.0f} ms, max {max(visible):.0f} ms", flush=True)
    if details:
        batches = [(int(p["batchId"]), int(p["durationMs"].get("addBatch", 0)))
                   for p in query.recentProgress if p.get("numInputRows")]
        print(f"    {mode}: addBatch ms per batch {batches}", flush=True)
        for m in getattr(fn, "metrics", []):
            print(f"    {mode}: batch {m.batch_id} prepare {m.prepare_ms:.0f} ms, decide "
                  f"{m.decide_ms:.0f} ms, commit {m.commit_ms:.0f} ms, total "
                  f"{m.total_ms:.0f} ms, waited {m.wait_ms:.0f} ms, visible after "
                  f"{m.visible_ms:.0f} ms", flush=True)
    exc = query.exception()
    if exc is not None:
        raise SystemExit(f"{mode} query failed: {exc}")
    shutil.rmtree(run_dir, ignore_errors=True)
    return seconds, topic


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--topic-partitions", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--bootstrap", default=os.environ.get("SPARKEOS_KAFKA_BOOTSTRAP"))
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--no-fsync", action="store_true", help="staged mode without fsync")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip counting the records in each output topic")
    parser.add_argument("--details", action="store_true",
                        help="print Spark's addBatch time of every micro-batch")
    parser.add_argument("--commit-parallelism", type=int, default=None,
                        help="the format's sparkeos.commitParallelism: its committers, "
                        "so its Kafka transactions per batch (default: the library's)")
    parser.add_argument("--linger-ms", type=int, default=None,
                        help="linger.ms for the confluent-kafka producers (default: librdkafka's)")
    args = parser.parse_args(argv)
    if args.commit_parallelism is not None:
        COMMITTERS[:] = [args.commit_parallelism]
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown or not modes:
        parser.error(f"--modes: choose from {MODES} (a ratio is printed where both its "
                     "modes ran)")

    # The local broker, stopped at exit if this run started it.
    bootstrap = args.bootstrap or service("kafka.sh", "SPARKEOS_KAFKA_BOOTSTRAP", "bootstrap")
    producer_config: dict[str, Any] = {}
    if args.linger_ms is not None:
        producer_config["linger.ms"] = args.linger_ms

    sys.path.insert(0, ROOT)
    from sparkeos.core.streaming.spark import local_session

    # One Spark partition per input file, so a batch has --partitions of them: Spark
    # packs small files into about defaultParallelism partitions otherwise (8 files of
    # a batch made 2 partitions on local[2]); a file's cost past the split size keeps
    # each file alone, and a split larger than any file keeps it whole.
    conf = {"spark.sql.shuffle.partitions": str(args.partitions),
            "spark.sql.files.maxPartitionBytes": "1g",
            "spark.sql.files.openCostInBytes": "1g",
            "spark.ui.showConsoleProgress": "false"}
    if "spark" in modes:
        from sparkeos.connectors.kafka import spark_kafka_jars

        conf["spark.jars"] = ",".join(spark_kafka_jars())
    workdir = tempfile.mkdtemp(prefix="sparkeos-bench-kafka-")
    try:
        print(f"generating {args.records} records of {args.record_bytes} bytes "
              f"({args.batches} batches x {args.partitions} partitions) ...", flush=True)
        input_dir = os.path.join(workdir, "input")
        value_bytes = generate_input(input_dir, args.records, args.batches, args.partitions,
                                     args.record_bytes)
        warm_dir = os.path.join(workdir, "warmup")
        # One batch at full size: the JVM and the workers warmed up on the same plan.
        generate_input(warm_dir, args.records // args.batches, 1, args.partitions,
                       args.record_bytes)
        spark = local_session("sparkeos-bench-kafka", args.master, conf)
        print(f"broker {bootstrap}; Spark {spark.version} {args.master}; modes {modes}",
              flush=True)
        for mode in modes:  # warm-up: JVM, Python workers, topic metadata
            run_query(spark, mode, warm_dir, args.partitions, bootstrap, workdir,
                      not args.no_fsync, args.topic_partitions, producer_config)
        times: dict[str, list[float]] = {m: [] for m in modes}
        topics: dict[str, str] = {}
        for round_ in range(args.repeats):
            order = modes[round_ % len(modes):] + modes[: round_ % len(modes)]
            for mode in order:
                seconds, topic = run_query(spark, mode, input_dir, args.partitions, bootstrap,
                                           workdir, not args.no_fsync, args.topic_partitions,
                                           producer_config, args.details)
                times[mode].append(seconds)
                topics[mode] = topic
                print(f"  round {round_ + 1} {mode:<7} {seconds:7.2f} s", flush=True)
        spark.stop()
        results = [Result(m, args.records, statistics.median(times[m])) for m in modes]
        if not args.no_verify:
            for r in results:
                if r.mode != "python_floor":  # it writes nothing
                    r.visible = count_committed(bootstrap, topics[r.mode], args.records)
        mb = value_bytes / 1e6
        print(f"\n{'mode':<8} {'records':>9} {'seconds':>8} {'records/s':>10} {'MB/s':>7}"
              f" {'read_committed':>15}")
        for r in results:
            seen = "-" if r.visible is None else str(r.visible)
            print(f"{r.mode:<8} {r.records:>9} {r.seconds:>8.2f} {r.records / r.seconds:>10.0f}"
                  f" {mb / r.seconds:>7.2f} {seen:>15}")
        by_mode = {r.mode: r for r in results}
        bad = [r.mode for r in results if r.visible is not None and r.visible != r.records]
        if bad:
            print(f"WARNING: record count differs from the input for: {', '.join(bad)}")
        # (label, numerator mode, denominator mode); "ratio exactly_once/plain" last.
        ratios = [("direct/plain", "direct", "plain"), ("spark/plain", "spark", "plain"),
                  ("exactly_once/spark", "staged", "spark"),
                  ("overlap/staged", "overlap", "staged"), ("overlap/spark", "overlap", "spark"),
                  ("format/foreachBatch", "format", "staged"), ("format/spark", "format", "spark"),
                  ("format/python floor", "format", "python_floor"),
                  ("exactly_once/plain", "staged", "plain")]
        for label, top, bottom in ratios:
            if top in by_mode and bottom in by_mode:
                print(f"ratio {label}: {by_mode[top].seconds / by_mode[bottom].seconds:.2f}")
        return 1 if bad else 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
