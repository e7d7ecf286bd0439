"""``format("sparkeos-kafka")`` without registration: Spark registers every installed
top-level module named ``pyspark_*`` that defines a ``DefaultSource`` data source."""

from sparkeos.connectors.kafka.format import KafkaFormat as DefaultSource

__all__ = ["DefaultSource"]
