"""Queries with ``overlap_commits`` into Kafka (staged: phase 2 runs in Spark tasks),
each ended one way, for the test of how a query ends (``test_query_end.py``).

    python -m integration.core.query_end_job spec.json

The spec names the broker, a work directory and the queries, run one after the other
in one driver: ``{"topic", "input", "end"}`` each. Ends:

* ``query_stop``: ``query.stop()`` once the input is processed;
* ``await``: an ``availableNow`` query, ``awaitTermination()``;
* ``processed``: ``processAllAvailable()`` (the report is taken when it returns), then
  ``query.stop()``;
* ``spark_stop``: ``spark.stop()`` once the input is processed, the query still active;
* ``exit``: the script ends once the input is processed, the query still active;
* ``context_lost``: an ``availableNow`` query, ``awaitTermination()``, but the JVM stops
  Spark's context (behind pyspark's back: what an application's end does) once the
  last batch prepared, before its decision: its commit meets a stopped context.

The other ends wait for the input with Spark's own ``processAllAvailable`` (unwrapped),
which returns with the last batch still committing. After each end call returns (or
raises) the job appends what the commit log holds at
that moment, and what the call raised, to ``<work>/report.jsonl``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

END_CALLS = ("query_stop", "await", "processed", "spark_stop", "exit", "context_lost")
NAME = "ends"
LAST_BATCH = 1


def losing_context(sink: Any) -> Any:
    """``sink``, but Spark's context stops in the JVM before the last batch's decision."""
    from sparkeos.connectors.kafka import KafkaSink

    class ContextLost(KafkaSink):
        def before_decision(self, batch_id: int, receipts: Any) -> None:
            super().before_decision(batch_id, receipts)
            if batch_id == LAST_BATCH:
                from pyspark import SparkContext

                context = SparkContext._active_spark_context
                assert context is not None
                context._jsc.sc().stop()

    return ContextLost(**{f.name: getattr(sink, f.name)
                          for f in dataclasses.fields(sink) if f.init})


def log_statuses(checkpoint: str) -> dict[str, str]:
    from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
    from sparkeos.core.storage.logstores import open_store

    log = CommitLog(open_store(sink_log_location(checkpoint, NAME)))
    return {str(b): s.status for b, s in sorted(log.batches().items())}


def run_query(spark: Any, bootstrap: str, work: str, index: int, query: dict[str, Any]
              ) -> dict[str, Any]:
    """Run ``query`` to the end its spec names; what the commit log holds right after."""
    from pyspark.sql.streaming.query import StreamingQuery

    from sparkeos import exactly_once
    from sparkeos.connectors.kafka import KafkaSink

    end = query["end"]
    assert end in END_CALLS, end
    checkpoint = os.path.join(work, f"checkpoint-{index}")
    sink = KafkaSink(bootstrap, topic=query["topic"],
                     staging_dir=os.path.join(work, f"staging-{index}"),
                     transactional_id_prefix=f"{query['topic']}-", timeout_s=20.0)
    stream = (spark.readStream.schema("id long, payload string")
              .option("maxFilesPerTrigger", 1).json(query["input"]).repartition(2))
    if end == "context_lost":
        sink = losing_context(sink)
    writer = (stream.writeStream.option("checkpointLocation", checkpoint)
              .foreachBatch(exactly_once(sink, name=NAME, overlap_commits=True)))
    if end in ("await", "context_lost"):
        started = writer.trigger(availableNow=True).start()
    else:
        started = writer.trigger(processingTime="100 milliseconds").start()
        if end == "processed":
            try:
                started.processAllAvailable()  # sparkeos' wrap waits for the commit
            except Exception:
                started.stop()
                raise
        else:
            # Spark's own wait, which returns with the last batch still committing:
            # the end call is then what has to wait for it.
            StreamingQuery.processAllAvailable.__wrapped__(started)
    raised = None
    statuses = None
    try:
        if end in ("await", "context_lost"):
            started.awaitTermination()
        elif end == "processed":
            statuses = log_statuses(checkpoint)
            started.stop()
        elif end == "query_stop":
            started.stop()
        elif end == "spark_stop":
            spark.stop()
    except Exception as exc:  # what the end call raised is the report's
        raised = {"type": type(exc).__name__, "message": str(exc)}
    return {"index": index, "end": end, "raised": raised,
            "statuses": statuses if statuses is not None else log_statuses(checkpoint)}


def main(argv: list[str]) -> int:
    from sparkeos.core.streaming.spark import local_session
    from sparkeos.testing import ahead
    from sparkeos.testing.job import SHORT_JOB_CONF, end_job

    spark = local_session("sparkeos-query-end", "local[2]", SHORT_JOB_CONF)
    spec_path = ahead.spec_path(argv)
    if spec_path is None:  # started ahead, not needed
        return end_job(spark)
    with open(spec_path) as fh:
        spec = json.load(fh)
    for index, query in enumerate(spec["queries"]):
        report = run_query(spark, spec["bootstrap"], spec["work"], index, query)
        with open(os.path.join(spec["work"], "report.jsonl"), "a") as fh:
            fh.write(json.dumps(report) + "\n")
    return 0  # the interpreter's exit: Python's own, not end_job's kill


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
