"""Apache Iceberg tables as exactly-once participants (issue 51): ``IcebergSink``."""

from .sink import IcebergSink

__all__ = ["IcebergSink"]
