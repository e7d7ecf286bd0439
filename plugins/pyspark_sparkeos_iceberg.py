"""``format("sparkeos-iceberg")`` without registration: Spark registers every installed
top-level module named ``pyspark_*`` that defines a ``DefaultSource`` data source."""

from sparkeos.connectors.iceberg.format import IcebergFormat as DefaultSource

__all__ = ["DefaultSource"]
