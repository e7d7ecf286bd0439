"""The two-phase snapshot core. Knows nothing about any connector."""

from typing import TYPE_CHECKING

from .lazy import lazy_exports

if TYPE_CHECKING:
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

__getattr__ = lazy_exports(__name__, {
    "AttemptFencedError": ".errors",
    "AttemptRange": ".txpool",
    "BatchMetrics": ".observe",
    "BatchRunner": ".tasks",
    "CommitLocation": ".protocol",
    "CommitLogError": ".errors",
    "ConfigurationError": ".errors",
    "Coordinator": ".coordinator",
    "CoordinatorConfig": ".config",
    "DataLossError": ".errors",
    "DataRejectedError": ".errors",
    "ForeachBatchAdapter": ".adapter",
    "Guarantee": ".config",
    "Receipt": ".protocol",
    "RetriableError": ".errors",
    "SchemaMismatchError": ".errors",
    "SparkEOSError": ".errors",
    "Transaction": ".protocol",
    "TransactionAbortedError": ".errors",
    "TransactionIdCollisionError": ".errors",
    "TransactionPool": ".txpool",
    "TransactionalSink": ".protocol",
    "TxnState": ".protocol",
    "at_least_once": ".adapter",
    "enable_json_logging": ".observe",
    "exactly_once": ".adapter",
    "with_guarantee": ".adapter",
})

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
