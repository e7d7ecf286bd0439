"""``format("sparkeos-delta")`` without registration: Spark registers every installed
top-level module named ``pyspark_*`` that defines a ``DefaultSource`` data source."""

from sparkeos.connectors.delta.format import DeltaFormat as DefaultSource

__all__ = ["DefaultSource"]
