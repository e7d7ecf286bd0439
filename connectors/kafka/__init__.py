"""Exactly-once Kafka sink and read_committed source helpers (confluent-kafka).

    from sparkeos import exactly_once
    from sparkeos.connectors.kafka import KafkaSink, kafka_source

    df = kafka_source(spark, "broker:9092", "in")            # read_committed
    sink = KafkaSink("broker:9092", topic="out", key_column="key", value_column="value")
    df.writeStream.foreachBatch(exactly_once(sink, name="to-kafka")).start()

confluent-kafka is imported only when a sink talks to Kafka, so importing this
package stays light. See ``sink`` for the modes and the commit protocol.
"""

from typing import TYPE_CHECKING

from sparkeos.core.lazy import lazy_exports

if TYPE_CHECKING:
    from sparkeos.core.text.records import RecordLayout

    from .sink import KafkaSink, default_staging_dir, read_topic
    from .source import kafka_source, spark_kafka_jars

# Imported on first use (sparkeos.core.lazy): Spark imports the format of this
# connector in processes that need its class only.
__getattr__ = lazy_exports(__name__, {
    "KafkaSink": ".sink",
    "RecordLayout": "sparkeos.core.text.records",
    "default_staging_dir": ".sink",
    "kafka_source": ".source",
    "read_topic": ".sink",
    "spark_kafka_jars": ".source",
})

__all__ = [
    "KafkaSink",
    "RecordLayout",
    "default_staging_dir",
    "kafka_source",
    "read_topic",
    "spark_kafka_jars",
]
