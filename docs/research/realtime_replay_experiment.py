"""What a replayed epoch of Spark's real-time mode holds (groundwork for issue 52).

A Kafka source (topic of 2 partitions, records produced at a steady rate all along) goes
through a Python ForeachWriter with ``trigger(realTime=...)``. Every ``close()`` logs one
JSON line to ``$EXP_LOG``: partition, epoch, the first and last source offset the task
saw, its row count, whether ``offsets/<epoch>`` existed in the checkpoint then. With
``KILL_AFTER=<epoch>`` the driver's whole process group is killed (kill -9) right after
partition 0 closed that epoch. Run it again on the same checkpoint without it: the log
then shows whether the replayed epoch of each partition starts and ends where the first
attempt did.

    python realtime_replay_experiment.py run BOOTSTRAP TOPIC CHECKPOINT SECONDS
    python realtime_replay_experiment.py produce BOOTSTRAP TOPIC SECONDS RATE

The driver of ``run`` must be started in a process group of its own (``setsid``).
"""
import json
import os
import signal
import sys
import time

LOG = os.environ.get("EXP_LOG", "realtime-replay.jsonl")


def log(**fields: object) -> None:
    with open(LOG, "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "at": time.time(), **fields}) + "\n")


class Writer:
    def __init__(self, checkpoint: str, kill_after: int | None) -> None:
        self.checkpoint = checkpoint
        self.kill_after = kill_after

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self.partition, self.epoch = partition_id, epoch_id
        self.first = self.last = None
        self.rows = 0
        self.sources: set[int] = set()
        log(event="open", partition=partition_id, epoch=epoch_id)
        return True

    def process(self, row: object) -> None:
        offset = row["offset"]  # type: ignore[index]
        self.sources.add(row["partition"])  # type: ignore[index]
        self.first = offset if self.first is None else self.first
        self.last = offset
        self.rows += 1

    def close(self, error: object) -> None:
        logged = os.path.exists(os.path.join(self.checkpoint, "offsets", str(self.epoch)))
        log(event="close", partition=self.partition, epoch=self.epoch, first=self.first,
            last=self.last, rows=self.rows, source_partitions=sorted(self.sources),
            error=None if error is None else str(error)[:200], offset_logged=logged)
        if self.kill_after is not None and self.epoch == self.kill_after \
                and self.partition == 0:
            log(event="kill", epoch=self.epoch)
            os.killpg(int(os.environ["EXP_DRIVER_GROUP"]), signal.SIGKILL)


def run(bootstrap: str, topic: str, checkpoint: str, seconds: float) -> None:
    from pyspark.sql import SparkSession

    from sparkeos.connectors.kafka.source import spark_kafka_jars

    os.environ["EXP_DRIVER_GROUP"] = str(os.getpgid(0))
    kill = os.environ.get("KILL_AFTER")
    spark = (SparkSession.builder.master("local[4]").appName("rtm-replay")
             .config("spark.jars", ",".join(spark_kafka_jars()))
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.realTimeMode.minBatchDuration", "1000")
             .getOrCreate())
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
          .option("subscribe", topic).option("startingOffsets", "earliest").load()
          .selectExpr("partition", "offset", "CAST(value AS STRING) AS value"))
    query = (df.writeStream.foreach(Writer(checkpoint, int(kill) if kill else None))
             .outputMode("update").option("checkpointLocation", checkpoint)
             .trigger(realTime="2 seconds").start())
    query.awaitTermination(seconds)
    query.stop()
    spark.stop()


def produce(bootstrap: str, topic: str, seconds: float, rate: float) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    started, sent = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        due = int((time.monotonic() - started) * rate)
        while sent < due:
            producer.produce(topic, str(sent).encode(), partition=sent % 2)
            sent += 1
        producer.poll(0)
        time.sleep(0.005)
    producer.flush(30)


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
    else:
        produce(sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]))
