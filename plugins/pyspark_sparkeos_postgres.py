"""``format("sparkeos-postgres")`` without registration: Spark registers every installed
top-level module named ``pyspark_*`` that defines a ``DefaultSource`` data source."""

from sparkeos.connectors.jdbc.format import PostgresFormat as DefaultSource

__all__ = ["DefaultSource"]
