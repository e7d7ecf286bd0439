"""``format("sparkeos-stomp")`` without registration: Spark registers every installed
top-level module named ``pyspark_*`` that defines a ``DefaultSource`` data source."""

from sparkeos.connectors.stomp.format import StompFormat as DefaultSource

__all__ = ["DefaultSource"]
