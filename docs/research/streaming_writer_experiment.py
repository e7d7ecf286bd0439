"""What Spark 4.3's Python streaming writer does, observed (groundwork for issue 26;
results in spark-python-streaming-writer.md, section 8). Every call of the writer is
logged as one JSON line to $EXP_LOG:

    EXP_LOG=log.jsonl python streaming_writer_experiment.py MODE CHECKPOINT INPUT [HOLD]

MODE: append, complete or update; INPUT: a directory of JSON files ``{"id": n}``, one
batch per file; HOLD: a batch id whose commit blocks (kill the driver meanwhile, then
run again without HOLD). EXP_CONNECT=1 runs through a local Spark Connect server.
"""
import json
import os
import sys
import time
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage

LOG = os.environ["EXP_LOG"]

def log(event, **kw):
    with open(LOG, "a") as f:
        f.write(json.dumps({"event": event, "pid": os.getpid(), **kw}) + "\n")

def latest(directory):
    if not os.path.isdir(directory):
        return None
    names = [int(n) for n in os.listdir(directory) if n.isdigit()]
    return max(names) if names else None


@dataclass
class Msg(WriterCommitMessage):
    partition: int
    attempt: int
    rows: int
    props: dict

class ExpWriter(DataSourceStreamWriter):
    def __init__(self, options, schema):
        self.options = dict(options)
        # The batch being planned: Spark writes offsets/<N> before it plans batch N.
        checkpoint = self.options["checkpointlocation"]
        self.planned = latest(os.path.join(checkpoint, "offsets"))
        log("streamWriter", options=self.options, schema=str(schema),
            latest_offsets=self.planned, latest_commit=latest(os.path.join(checkpoint, "commits")))

    def write(self, iterator):
        from pyspark import TaskContext
        ctx = TaskContext.get()
        n = sum(1 for _ in iterator)
        props = {k: ctx.getLocalProperty(k) for k in
                 ("sql.streaming.queryId", "streaming.sql.batchId", "spark.jobGroup.id")}
        log("write", planned=self.planned, partition=ctx.partitionId(),
            attempt=ctx.attemptNumber(), rows=n, props=props)
        return Msg(ctx.partitionId(), ctx.attemptNumber(), n, props)

    def commit(self, messages, batchId):
        log("commit", batch=batchId, messages=[m.__dict__ if m else None for m in messages],
            session=str(SparkSession.getActiveSession()))
        hold = self.options.get("hold_commit_of")
        if hold is not None and int(hold) == batchId:
            log("holding", batch=batchId)
            time.sleep(3600)

    def abort(self, messages, batchId):
        log("abort", batch=batchId, messages=[m.__dict__ if m else None for m in messages])

class ExpSource(DataSource):
    @classmethod
    def name(cls):
        return "exp"
    def streamWriter(self, schema, overwrite):
        log("overwrite", overwrite=overwrite)
        return ExpWriter(self.options, schema)

def main():
    mode, cp, src = sys.argv[1], sys.argv[2], sys.argv[3]
    hold = sys.argv[4] if len(sys.argv) > 4 else None
    connect = os.environ.get("EXP_CONNECT")
    b = SparkSession.builder.config("spark.ui.enabled", "false") \
        .config("spark.sql.shuffle.partitions", "2")
    spark = b.remote("local[2]").getOrCreate() if connect else b.master("local[2]").getOrCreate()
    spark.dataSource.register(ExpSource)
    df = spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(src)
    if mode in ("update", "complete"):
        df = df.groupBy((df.id % 3).alias("k")).count()
    w = df.writeStream.format("exp").option("checkpointLocation", cp).option("someOption", "X")
    if hold:
        w = w.option("hold_commit_of", hold)
    if mode in ("update", "complete"):
        w = w.outputMode(mode)
    q = w.trigger(availableNow=True).start()
    q.awaitTermination()
    log("done")

if __name__ == "__main__":
    main()
