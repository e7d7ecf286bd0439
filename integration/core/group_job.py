"""The foreachBatch function of the sink-group test: PostgreSQL and Kafka under one
decision (a factory for ``sparkeos.testing.job``'s ``function`` mode)."""

from __future__ import annotations

from typing import Any


def pg_and_kafka(dsn: str, table: str, marker: str, bootstrap: str, topic: str,
                 staging_dir: str, prefix: str) -> Any:
    from pyspark.sql import functions as F

    from sparkeos import exactly_once
    from sparkeos.connectors.jdbc import PostgresSink
    from sparkeos.connectors.kafka import KafkaSink

    db = PostgresSink(dsn=dsn, table=table, marker_table=marker, create_table=True)
    events = KafkaSink(bootstrap, topic=topic, staging_dir=staging_dir,
                       transactional_id_prefix=prefix, key_column="key",
                       value_column="value")

    def to_events(df: Any) -> Any:
        return df.select(F.col("id").cast("string").alias("key"),
                         F.to_json(F.struct("id", "payload")).alias("value"))

    return exactly_once({"db": db, "events": (events, to_events)}, name="group")
