"""sparkeos: exactly-once connectors for Spark Structured Streaming.

    from sparkeos import exactly_once
    from sparkeos.connectors.file import FileSink

    df.writeStream.foreachBatch(exactly_once(FileSink("/data/out"), name="out"))

Connectors live in ``sparkeos.connectors.<name>`` and import their drivers lazily.
"""

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
    exactly_once,
    with_guarantee,
)

__version__ = "0.1.0"

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
    "exactly_once",
    "with_guarantee",
]
