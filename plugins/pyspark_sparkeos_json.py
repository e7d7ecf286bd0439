"""``format("sparkeos-json")`` without registration: Spark registers every installed
top-level module named ``pyspark_*`` that defines a ``DefaultSource`` data source."""

from sparkeos.connectors.file.format import JsonFormat as DefaultSource

__all__ = ["DefaultSource"]
