"""sparkeos: exactly-once connectors for Spark Structured Streaming.

    from sparkeos import exactly_once
    from sparkeos.connectors.file import FileSink

    df.writeStream.foreachBatch(exactly_once(FileSink("/data/out"), name="out"))

Or as a format of Spark's own, which installing sparkeos registers (else
``sparkeos.register(spark)``; docs/formats.md):

    df.writeStream.format("sparkeos-parquet").option("path", "/data/out")

Connectors live in ``sparkeos.connectors.<name>`` and import their drivers lazily.
"""

from typing import TYPE_CHECKING
from typing import Any as _Any

from sparkeos.core.lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from sparkeos.core import (
        BatchMetrics,
        CommitLogError,
        ConfigurationError,
        DataLossError,
        Guarantee,
        RetriableError,
        SchemaMismatchError,
        SparkEOSError,
        TransactionAbortedError,
        TransactionalSink,
        at_least_once,
        at_least_once_writer,
        exactly_once,
        exactly_once_writer,
        with_guarantee,
    )

__version__ = "0.1.0"


def register(spark: _Any) -> list[str]:
    """Register every sparkeos format (``sparkeos-parquet``...) with ``spark``."""
    from sparkeos.formats import register as _register

    return _register(spark)


__all__ = [
    "BatchMetrics",
    "CommitLogError",
    "ConfigurationError",
    "DataLossError",
    "Guarantee",
    "RetriableError",
    "SchemaMismatchError",
    "SparkEOSError",
    "TransactionAbortedError",
    "TransactionalSink",
    "__version__",
    "at_least_once",
    "at_least_once_writer",
    "exactly_once",
    "exactly_once_writer",
    "register",
    "with_guarantee",
]

# Imported on first use: Spark's own Python processes import the formats' plugin
# modules, which need only the format classes (sparkeos.core.lazy).
__getattr__ = _lazy_exports(__name__, {
    name: "sparkeos.core" for name in __all__ if name not in ("__version__", "register")})
