"""STOMP -> Spark -> file / STOMP in a child process (so tests can kill it).

    python -m integration.connectors.stomp.stomp_job spec.json

Reads ``input_queue`` with ``stomp_source`` (bodies are JSON ``{"id": ...}``) and
writes ``id, payload`` through ``FileSink`` (Parquet) or ``StompSink``.
``mode="plain"`` is what users write without sparkeos: a foreachBatch on a rate source
that receives messages with stomp.py, writes them, then acknowledges them (the sink
faults of ``SPARKEOS_FAULT`` kill it after the write, before the ack).
Faults: ``SPARKEOS_FAULT`` (sink protocol points) and ``SPARKEOS_SOURCE_FAULT`` (source
points, ``sparkeos.core.faults.SOURCE_POINTS``).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from sparkeos.testing import ahead
from sparkeos.testing.job import (
    JobResult,
    await_query,
    end_job,
    run_spec_process,
    run_warm,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


@dataclass
class StompJobSpec:
    url: str
    input_queue: str
    checkpoint: str
    spool_dir: str
    output: str
    """file: a directory; stomp: a queue."""
    sink: str = "file"
    mode: str = "exactly_once"
    max_batch_messages: int = 40
    body_format: str = "json"
    on_bad_message: str = "fail"
    dead_letter_destination: str | None = None
    message_id_header: str | None = None
    poll_timeout_s: float = 3.0
    drain: bool = False
    """Start the query again in the same session until a run reads nothing: the
    messages of a run's last batch are acknowledged by the next run, so one process
    drains the queue (what a restart would, without a new JVM)."""


def run_stomp_job(spec: StompJobSpec, fault: str | None = None,
                  source_fault: str | None = None, env: dict[str, str] | None = None,
                  timeout: float = 300.0) -> JobResult:
    """A run that something kills in a child process; else in the warm session of this
    process (see ``sparkeos.testing.job.run_job``)."""
    if fault is None and source_fault is None and not env:
        return run_warm(lambda spark: run_stomp_spec(spec, spark, timeout))
    # A source fault reaches the source's runner (a process Spark starts) through the
    # plan directory of a process started ahead (sparkeos.testing.ahead).
    return run_spec_process("integration.connectors.stomp.stomp_job", asdict(spec),
                            spec.checkpoint + ".spec.json", fault, timeout, env or None,
                            cwd=ROOT, ahead_settings=None if env else {},
                            source_fault=source_fault)


def _sink(spec: StompJobSpec) -> Any:
    if spec.sink == "stomp":
        from sparkeos.connectors.stomp import StompSink

        return StompSink(spec.url, destination=spec.output,
                         staging_dir=spec.checkpoint + "-staging")
    from sparkeos.connectors.file import FileSink

    return FileSink(spec.output)


def _plain(spec: StompJobSpec, spark: Any) -> Any:
    """The plain consumer: receive, write, ack; a fault kills it between write and ack."""
    from sparkeos.connectors.stomp.client import Endpoint, StompClient
    from sparkeos.core.faults import FaultPlan

    fault = FaultPlan.from_env()
    endpoint = Endpoint.parse(spec.url)

    def batch_fn(_df: Any, batch_id: int) -> None:
        with StompClient(endpoint) as client:
            client.subscribe(spec.input_queue, "plain", "client-individual",
                             {"subscription-type": "ANYCAST"} if client.kind == "artemis"
                             else {})
            frames = []
            while len(frames) < spec.max_batch_messages:
                frame = client.receive(spec.poll_timeout_s if not frames else 0.3)
                if frame is None:
                    break
                frames.append(frame)
            rows = [(int(json.loads(f.body)["id"]), f.body.decode()) for f in frames]
            if rows:
                spark.createDataFrame(rows, "id long, payload string").write.mode(
                    "append").parquet(spec.output)
            fault.driver("after_finished", batch_id)  # written, not yet acknowledged
            if frames:
                receipt = client.new_receipt()
                for i, f in enumerate(frames):
                    client.ack(f.headers["ack"],
                               receipt=receipt if i == len(frames) - 1 else None)
                client.wait_receipt(receipt, "acks")

    return batch_fn


def main(argv: list[str]) -> int:
    from sparkeos.core.streaming.spark import local_session

    spark = local_session("sparkeos-stomp-job", "local[2]")
    spec_path = ahead.spec_path(argv)
    if spec_path is None:  # started ahead, not needed
        return end_job(spark)
    with open(spec_path) as fh:
        spec = StompJobSpec(**json.load(fh))
    run_stomp_spec(spec, spark)
    return end_job(spark)


def run_stomp_spec(spec: StompJobSpec, spark: Any, timeout: float | None = None) -> None:
    """Run the job on ``spark`` until its input is drained (once, or with ``drain``
    until a run reads nothing); the session stays open."""
    from sparkeos.connectors.stomp import stomp_source
    from sparkeos.core.streaming.adapter import exactly_once

    if spec.mode == "plain":
        ticks = spec.checkpoint + "-ticks"  # one batch per file: a consume each
        os.makedirs(ticks, exist_ok=True)
        run = uuid.uuid4().hex[:8]  # new files each run: a restart consumes again
        for i in range(8):
            with open(os.path.join(ticks, f"tick-{run}-{i:03d}.txt"), "w") as fh:
                fh.write(f"{i}\n")
        stream = spark.readStream.option("maxFilesPerTrigger", 1).text(ticks)
        query = (stream.writeStream.foreachBatch(_plain(spec, spark))
                 .option("checkpointLocation", spec.checkpoint)
                 .trigger(availableNow=True).start())
        await_query(query, timeout, "the STOMP job")
        return
    source = stomp_source(
        spark, spec.url, spec.input_queue, spool_dir=spec.spool_dir,
        max_batch_messages=spec.max_batch_messages, body_format=spec.body_format,
        on_bad_message=spec.on_bad_message,
        dead_letter_destination=spec.dead_letter_destination,
        message_id_header=spec.message_id_header, poll_timeout_s=spec.poll_timeout_s)
    df = source.selectExpr("CAST(get_json_object(body, '$.id') AS BIGINT) AS id",
                           "body AS payload")
    for _ in range(8 if spec.drain else 1):
        sink = _sink(spec)
        query = (df.writeStream.foreachBatch(exactly_once(sink, name="from-stomp"))
                 .option("checkpointLocation", spec.checkpoint)
                 .trigger(availableNow=True).start())
        try:
            await_query(query, timeout, "the STOMP job")
        finally:
            sink.close()
        if not sum(int(p.numInputRows) for p in query.recentProgress):
            break


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
