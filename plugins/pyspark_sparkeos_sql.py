"""``format("sparkeos-sql")`` without registration: Spark registers every installed
top-level module named ``pyspark_*`` that defines a ``DefaultSource`` data source."""

from sparkeos.connectors.sql.format import SqlFormat as DefaultSource

__all__ = ["DefaultSource"]
