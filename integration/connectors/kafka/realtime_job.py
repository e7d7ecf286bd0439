"""Kafka -> Spark's real-time mode -> Kafka, in a child process (so tests can kill it).

    python -m integration.connectors.kafka.realtime_job spec.json

While it runs, the job produces ``total`` records ``{"id": i}`` to ``input_topic`` at
``rate`` records a second, those the topic does not hold yet (a restart goes on where
the killed run stopped, gaps first), so epochs end in the middle of the stream and a replayed epoch
ends elsewhere than the attempt it replays. A real-time query
(``trigger(realTime=...)``) reads ``input_topic`` and writes through
``exactly_once_writer(KafkaSink(output_topic))`` (``mode="plain"``: a ForeachWriter
with a plain producer, flushed in ``close``; ``pg_dsn``: ``PostgresSink`` into
``pg_table`` instead, its rows ``id, payload``). The query stops once ``output_topic``
(or the table) holds every id of ``range(total)``, committed (or at ``timeout_s``). Faults:
``SPARKEOS_FAULT`` with a point of ``core.faults.REALTIME_POINTS`` (plain mode: any point kills the
driver after partition 0 flushed that epoch).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from sparkeos.testing.job import JobResult, end_job, run_spec_process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
EPOCH = "1 second"
MIN_EPOCH_MS = "1000"


@dataclass
class RealTimeJobSpec:
    bootstrap: str
    input_topic: str
    output_topic: str
    checkpoint: str
    total: int = 3000
    rate: float = 150.0
    mode: str = "exactly_once"
    timeout_s: float = 240.0
    pg_dsn: str = ""
    """Set: write ``id`` and ``payload`` into ``pg_table`` through PostgresSink instead."""
    pg_table: str = ""
    pg_marker_table: str = "sparkeos_markers"
    connect: bool = False
    """Through Spark Connect (a local Connect server started by this job)."""


def run_realtime_job(spec: RealTimeJobSpec, fault: str | None = None,
                     kill_after_s: float | None = None) -> JobResult:
    """Run the job in a process group of its own; ``kill_after_s``: kill -9 the whole
    group that many seconds after its start (at a moment no protocol step chose)."""
    return run_spec_process("integration.connectors.kafka.realtime_job", asdict(spec),
                            spec.checkpoint + ".spec.json", fault,
                            kill_after_s or spec.timeout_s + 60, cwd=ROOT)


class PlainWriter:
    """What users write without sparkeos: a producer per task, flushed in ``close``."""

    def __init__(self, bootstrap: str, topic: str, fault: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        point, _, epoch = fault.partition("@")
        self.kill_epoch = int(epoch) if point and epoch else None

    def open(self, partition_id: int, epoch_id: int) -> bool:
        from confluent_kafka import Producer

        self.partition, self.epoch = partition_id, epoch_id
        self.producer = Producer({"bootstrap.servers": self.bootstrap})
        return True

    def process(self, row: Any) -> None:
        self.producer.produce(self.topic, bytes(row["value"]))

    def close(self, error: Any) -> None:
        self.producer.flush(30)
        if error is None and self.partition == 0 and self.epoch == self.kill_epoch:
            from sparkeos.core.faults import driver_group

            os.killpg(driver_group(), signal.SIGKILL)


def produce_input(spec: RealTimeJobSpec, stop: threading.Event) -> None:
    """Produce every id of ``range(total)`` the input topic lacks, at ``rate``. A killed
    run can leave a gap (a record still in its producer's queue for one partition
    while later ones reached the other), so what is missing is read, not counted."""
    from confluent_kafka import Consumer, Producer

    from sparkeos.connectors.kafka import read_topic

    consumer = Consumer({"bootstrap.servers": spec.bootstrap, "group.id": "count"})
    parts = len(consumer.list_topics(spec.input_topic, 30).topics[spec.input_topic].partitions)
    consumer.close()
    present = {int(json.loads(m.value())["id"])
               for m in read_topic(spec.bootstrap, spec.input_topic, timeout_s=30)}
    missing = [i for i in range(spec.total) if i not in present]
    producer = Producer({"bootstrap.servers": spec.bootstrap, "enable.idempotence": True})
    started, sent = time.monotonic(), 0
    while sent < len(missing) and not stop.is_set():
        due = min(len(missing), int((time.monotonic() - started) * spec.rate))
        while sent < due:
            producer.produce(spec.input_topic, json.dumps({"id": missing[sent]}).encode(),
                             partition=missing[sent] % parts)
            sent += 1
        producer.poll(0)
        stop.wait(0.01)
    producer.flush(30)


def distinct_ids_committed(spec: RealTimeJobSpec) -> int:
    """How many of the input's ids the output holds, each counted once: a writer that
    duplicates (plain mode) must not end the query before every id arrived."""
    if spec.pg_dsn:
        import psycopg2

        with psycopg2.connect(spec.pg_dsn) as conn, conn.cursor() as cur:
            cur.execute(f'SELECT count(DISTINCT id) FROM "{spec.pg_table}"')
            return int(cur.fetchone()[0])
    from sparkeos.connectors.kafka import read_topic

    return len({json.loads(m.value())["id"]
                for m in read_topic(spec.bootstrap, spec.output_topic, timeout_s=30)})


def main(argv: list[str]) -> int:
    from sparkeos.connectors.kafka import KafkaSink, spark_kafka_jars
    from sparkeos.core.streaming.realtime import exactly_once_writer
    from sparkeos.core.streaming.spark import local_session

    with open(argv[0]) as fh:
        spec = RealTimeJobSpec(**json.load(fh))
    conf = {"spark.jars": ",".join(spark_kafka_jars()),
            "spark.sql.streaming.realTimeMode.minBatchDuration": MIN_EPOCH_MS}
    if spec.connect:
        from sparkeos.core.faults import KILL_GROUP_ENV
        from sparkeos.core.streaming.spark import connect_session

        # The writer runs in the Connect server's Python workers: a kill there kills
        # this job's whole process group, the server with it.
        os.environ[KILL_GROUP_ENV] = str(os.getpgid(0))
        spark = connect_session("sparkeos-realtime-job", "local[4]", conf)
    else:
        spark = local_session("sparkeos-realtime-job", "local[4]", conf)
    stop = threading.Event()
    producing = threading.Thread(target=produce_input, args=(spec, stop), daemon=True)
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", spec.bootstrap)
          .option("subscribe", spec.input_topic).option("startingOffsets", "earliest")
          .load().selectExpr("CAST(key AS BINARY) AS key", "value"))
    writer: Any
    if spec.pg_dsn:
        from sparkeos.connectors.jdbc import PostgresSink

        df = df.selectExpr(
            "CAST(get_json_object(CAST(value AS STRING), '$.id') AS BIGINT) AS id",
            "CAST(value AS STRING) AS payload")
        writer = exactly_once_writer(
            PostgresSink(spec.pg_dsn, table=spec.pg_table,
                         marker_table=spec.pg_marker_table), "realtime",
            checkpoint_location=spec.checkpoint)
    elif spec.mode == "plain":
        writer = PlainWriter(spec.bootstrap, spec.output_topic,
                             os.environ.get("SPARKEOS_FAULT", ""))
    else:
        writer = exactly_once_writer(
            # Transactions a kill leaves open outlast the test (not the broker's
            # minute): only a fence ends them, a restart's or `sparkeos recover`'s.
            KafkaSink(spec.bootstrap, topic=spec.output_topic, key_column="key",
                      value_column="value", transaction_timeout_ms=600_000), "realtime",
            checkpoint_location=spec.checkpoint)
    query = (df.writeStream.foreach(writer).outputMode("update")
             .option("checkpointLocation", spec.checkpoint)
             .trigger(realTime=EPOCH).start())
    # Records arrive while epochs run (from the query's start on), so each epoch ends
    # in the middle of the stream.
    producing.start()
    deadline = time.monotonic() + spec.timeout_s
    try:
        while time.monotonic() < deadline and query.isActive:
            if not producing.is_alive() and distinct_ids_committed(spec) >= spec.total:
                break
            query.awaitTermination(2)
    finally:
        stop.set()
        failure = query.exception()
        query.stop()
    if failure is not None:
        print(f"the query failed: {failure}", file=sys.stderr, flush=True)
        return 1
    return end_job(spark)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
