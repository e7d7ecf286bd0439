"""The Kafka sink as a Spark format: ``writeStream.format("sparkeos-kafka")`` takes
the options and columns of Spark's own ``format("kafka")``:

* ``kafka.bootstrap.servers`` (required) and any other ``kafka.<librdkafka setting>``
  (``kafka.transaction.timeout.ms`` sets the sink's transaction timeout);
* ``topic``: every row's topic (it overrides a ``topic`` column, as in Spark);
* columns ``value`` (required), ``key``, ``topic``, ``headers``
  (``array<struct<key: string, value: binary>>``); string or binary keys and values
  are written as their bytes. A ``partition`` column is refused: the records of a
  participant are published by one producer whose partitioner picks the partition.

sparkeos' own settings: ``sparkeos.stagingDir``, ``sparkeos.transactionalIdPrefix``,
``sparkeos.markerTopic``, ``sparkeos.fsync`` and the options every format shares
(``core.streaming.streamformat``).
``outputMode("complete")`` publishes every batch's whole result table, as Spark's
Kafka sink does (a reader keeps the last record of each key). Exactly-once only in
staged mode; ``sparkeos.guarantee=at_least_once`` takes the same
path with each task committing its own transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkeos.core.errors import ConfigurationError, SchemaMismatchError
from sparkeos.core.streaming.streamformat import Options, SinkFormat

if TYPE_CHECKING:  # the sink is imported where made: Spark imports a format where it
    # needs only the class (sparkeos.core.lazy)
    import pyarrow as pa

    from .sink import KafkaSink


class KafkaFormat(SinkFormat):
    """``format("sparkeos-kafka")``: Spark's Kafka sink, exactly once."""

    format_name = "sparkeos-kafka"
    complete_mode_appends = True  # as Spark's kafka sink: each batch's whole table

    def make_sink(self, options: Options, schema: pa.Schema) -> KafkaSink:
        from .config import DEFAULT_MARKER_TOPIC
        from .sink import KafkaSink

        producer = options.with_prefix("kafka.")
        servers = producer.pop("bootstrap.servers", None)
        if not servers:
            raise ConfigurationError(
                "the sparkeos-kafka format needs the option 'kafka.bootstrap.servers'",
                fix='.option("kafka.bootstrap.servers", "host:9092")')
        producer.pop("transaction.timeout.ms", None)  # the sink's own setting, below
        columns = set(schema.names)
        if "value" not in columns:
            raise SchemaMismatchError(
                f"the stream has no 'value' column (it has {', '.join(schema.names)}): "
                "Spark's Kafka sink, and so sparkeos-kafka, writes each row's 'value'",
                fix="select the record's value as a 'value' column, e.g. "
                '.selectExpr("CAST(key AS STRING) AS key", "to_json(struct(*)) AS value")')
        if "partition" in columns:
            raise ConfigurationError(
                "the stream has a 'partition' column, which sparkeos-kafka cannot honour: "
                "each participant's records are published by one transactional producer "
                "whose partitioner (by key) picks the partition",
                fix="drop the 'partition' column (records with equal keys still land in "
                "one partition), or use foreachBatch with a sink of your own")
        topic = options.get("topic")
        if topic is None and "topic" not in columns:
            raise ConfigurationError(
                "sparkeos-kafka needs a topic: the option 'topic' or a 'topic' column",
                fix='.option("topic", "events")')
        return KafkaSink(
            bootstrap_servers=servers, topic=topic,
            topic_column="topic" if topic is None else None,
            key_column="key" if "key" in columns else None, value_column="value",
            headers_column="headers" if "headers" in columns else None,
            producer_config=dict(producer),
            transaction_timeout_ms=options.integer("kafka.transaction.timeout.ms", 60_000),
            staging_dir=options.get("sparkeos.stagingDir"),
            fsync=options.flag("sparkeos.fsync", True),
            transactional_id_prefix=options.get("sparkeos.transactionalIdPrefix") or "",
            marker_topic=options.get("sparkeos.markerTopic") or DEFAULT_MARKER_TOPIC)


FORMATS = (KafkaFormat,)
