"""The two-phase snapshot core. Knows nothing about any connector."""

from .adapter import ForeachBatchAdapter, at_least_once, exactly_once, with_guarantee
from .config import CoordinatorConfig, Guarantee
from .coordinator import Coordinator
from .errors import (
    AttemptFencedError,
    CommitLogError,
    ConfigurationError,
    DataLossError,
    DataRejectedError,
    RetriableError,
    SchemaMismatchError,
    SparkEOSError,
    TransactionAbortedError,
    TransactionIdCollisionError,
)
from .observe import BatchMetrics, enable_json_logging
from .protocol import CommitLocation, Receipt, Transaction, TransactionalSink, TxnState
from .tasks import BatchRunner
from .txpool import AttemptRange, TransactionPool

__all__ = [
    "AttemptFencedError",
    "AttemptRange",
    "BatchMetrics",
    "BatchRunner",
    "CommitLocation",
    "CommitLogError",
    "ConfigurationError",
    "Coordinator",
    "CoordinatorConfig",
    "DataLossError",
    "DataRejectedError",
    "ForeachBatchAdapter",
    "Guarantee",
    "Receipt",
    "RetriableError",
    "SchemaMismatchError",
    "SparkEOSError",
    "Transaction",
    "TransactionAbortedError",
    "TransactionIdCollisionError",
    "TransactionPool",
    "TransactionalSink",
    "TxnState",
    "at_least_once",
    "enable_json_logging",
    "exactly_once",
    "with_guarantee",
]
