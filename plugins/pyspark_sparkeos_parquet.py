"""``format("sparkeos-parquet")`` without registration: Spark registers every installed
top-level module named ``pyspark_*`` that defines a ``DefaultSource`` data source."""

from sparkeos.connectors.file.format import ParquetFormat as DefaultSource

__all__ = ["DefaultSource"]
