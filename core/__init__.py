"""The two-phase snapshot core. Knows nothing about any connector.

At the top, what a connector author imports: the contract (``protocol``), ``errors``,
``config``, ``observe``, the fault points and steps a participant marks (``faults``,
``steps``) and the helpers (``dedup``, ``idempotent``). The rooms below
(docs/architecture.md): ``snapshot`` (the protocol), ``storage`` (file systems and the
commit log's stores), ``text`` (Spark's text and records) and ``streaming`` (Spark's
entry points).
"""

from typing import TYPE_CHECKING

from . import moved
from .lazy import lazy_exports

moved.install()

if TYPE_CHECKING:
    from sparkeos.core.snapshot.coordinator import Coordinator
    from sparkeos.core.snapshot.tasks import BatchRunner
    from sparkeos.core.snapshot.txpool import AttemptRange, TransactionPool
    from sparkeos.core.streaming.adapter import (
        ForeachBatchAdapter,
        at_least_once,
        exactly_once,
        with_guarantee,
    )
    from sparkeos.core.streaming.realtime import at_least_once_writer, exactly_once_writer

    from .config import CoordinatorConfig, Guarantee
    from .errors import (
        AttemptFencedError,
        CommitLogError,
        ConfigurationError,
        DataLossError,
        DataRejectedError,
        ReplayMismatchError,
        RetriableError,
        SchemaMismatchError,
        SparkEOSError,
        TransactionAbortedError,
        TransactionIdCollisionError,
    )
    from .observe import BatchMetrics, enable_json_logging
    from .protocol import (
        CommitLocation,
        EpochParticipant,
        Receipt,
        Transaction,
        TransactionalSink,
        TxnState,
    )

__getattr__ = lazy_exports(__name__, {
    "AttemptFencedError": ".errors",
    "AttemptRange": ".snapshot.txpool",
    "BatchMetrics": ".observe",
    "BatchRunner": ".snapshot.tasks",
    "CommitLocation": ".protocol",
    "CommitLogError": ".errors",
    "ConfigurationError": ".errors",
    "Coordinator": ".snapshot.coordinator",
    "CoordinatorConfig": ".config",
    "DataLossError": ".errors",
    "DataRejectedError": ".errors",
    "ForeachBatchAdapter": ".streaming.adapter",
    "Guarantee": ".config",
    "Receipt": ".protocol",
    "RetriableError": ".errors",
    "SchemaMismatchError": ".errors",
    "SparkEOSError": ".errors",
    "Transaction": ".protocol",
    "TransactionAbortedError": ".errors",
    "TransactionIdCollisionError": ".errors",
    "TransactionPool": ".snapshot.txpool",
    "TransactionalSink": ".protocol",
    "TxnState": ".protocol",
    "at_least_once": ".streaming.adapter",
    "at_least_once_writer": ".streaming.realtime",
    "enable_json_logging": ".observe",
    "EpochParticipant": ".protocol",
    "exactly_once": ".streaming.adapter",
    "exactly_once_writer": ".streaming.realtime",
    "ReplayMismatchError": ".errors",
    "with_guarantee": ".streaming.adapter",
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
    "EpochParticipant",
    "ForeachBatchAdapter",
    "Guarantee",
    "Receipt",
    "ReplayMismatchError",
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
    "at_least_once_writer",
    "enable_json_logging",
    "exactly_once",
    "exactly_once_writer",
    "with_guarantee",
]
