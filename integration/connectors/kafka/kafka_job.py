"""Kafka -> Spark -> Kafka streaming job in a child process (so tests can kill it).

    python -m integration.connectors.kafka.kafka_job spec.json

Reads ``input_topic`` with Spark's Kafka source (``kafka_source``: read_committed),
parses the JSON values and writes them to ``output_topic`` through ``KafkaSink``
(``mode="exactly_once"``) or with the plain foreachBatch producer (``"plain"``).
Faults come from ``SPARKEOS_FAULT`` as for ``sparkeos.testing.job``; in plain mode
any fault kills the driver after the named batch was written.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

from sparkeos.testing import ahead
from sparkeos.testing.job import JobResult, crash_after_write, end_job, run_spec_process

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


@dataclass
class KafkaJobSpec:
    bootstrap: str
    input_topic: str
    output_topic: str
    checkpoint: str
    staging_dir: str
    transactional_id_prefix: str
    mode: str = "exactly_once"
    max_offsets_per_trigger: int = 20


def run_kafka_job(spec: KafkaJobSpec, fault: str | None = None,
                  timeout: float = 300.0) -> JobResult:
    return run_spec_process("integration.connectors.kafka.kafka_job", asdict(spec),
                            spec.checkpoint + ".spec.json", fault, timeout, cwd=ROOT,
                            ahead_settings={})


def main(argv: list[str]) -> int:
    from sparkeos.connectors.kafka import KafkaSink, kafka_source, spark_kafka_jars
    from sparkeos.connectors.kafka.plain import plain_foreachbatch_writer
    from sparkeos.core.streaming.adapter import exactly_once
    from sparkeos.core.streaming.spark import local_session

    spark = local_session("sparkeos-kafka-job", "local[2]",
                          {"spark.jars": ",".join(spark_kafka_jars())})
    spec_path = ahead.spec_path(argv)
    if spec_path is None:  # started ahead, not needed
        return end_job(spark)
    with open(spec_path) as fh:
        spec = KafkaJobSpec(**json.load(fh))
    source = kafka_source(spark, spec.bootstrap, spec.input_topic,
                          maxOffsetsPerTrigger=spec.max_offsets_per_trigger)
    df = source.selectExpr(
        "get_json_object(CAST(value AS STRING), '$.id') AS id_text",
        "CAST(value AS STRING) AS payload",
    ).selectExpr("CAST(id_text AS BIGINT) AS id", "payload")
    batch_fn: Any
    if spec.mode == "plain":
        batch_fn = crash_after_write(
            plain_foreachbatch_writer(spec.bootstrap, spec.output_topic))
    else:
        sink = KafkaSink(spec.bootstrap, topic=spec.output_topic, staging_dir=spec.staging_dir,
                         transactional_id_prefix=spec.transactional_id_prefix)
        batch_fn = exactly_once(sink, name="kafka-e2e")
    query = (df.writeStream.foreachBatch(batch_fn)
             .option("checkpointLocation", spec.checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return end_job(spark)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
