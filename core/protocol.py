"""The participant contract a connector author implements.

A sink is one class. The coordinator (never the connector) decides when each hook
runs; the order per guarantee is:

exactly-once (``exactly_once(sink, name=...)``)::

    driver   validate(schema)                       once per batch, before anything
    driver   [commit log: begun(N, partitions, slot)]
    task p   h = begin(txn_p); write(h, batch)...; receipt_p = prepare(h)
             (on any error in the task: abort(h), then the error propagates)
    driver   [commit log: decided(N, receipts)]     the point of no return
    driver*  commit(txn_p, receipt_p) for every p   (* in tasks if commit_location
                                                     is TASKS)
    driver   [commit log: finished(N)]
    recovery recover_commit(txn, receipt) for decided batches,
             rollback(txn) for every ID of a begun-but-undecided batch

at-least-once / none::

    task p   h = begin(txn_p); write(h, ...); receipt = prepare(h); commit(txn_p, receipt)

Rules every implementation must keep (the conformance suite checks them):

* ``prepare`` makes the writes durable but invisible; after it returns, ``commit``
  must succeed with only ``txn`` and ``receipt`` in hand, from another process,
  after the writer died.
* ``commit`` is idempotent: committing an already committed transaction is a no-op.
  If the prepared state is gone and the work is not visible, raise ``DataLossError``.
* ``rollback`` is idempotent and must accept IDs that were never used.
* A later ``begin`` of the same transaction ID fences the earlier attempt: nothing
  the earlier attempt writes afterwards may ever become visible.

Sinks are pickled to Spark's Python workers: keep connections out of ``__init__``
(open them lazily) and make configs frozen dataclasses validated at construction.
"""

from __future__ import annotations

import dataclasses
import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import pyarrow as pa

from .config import Guarantee

JsonDict = dict[str, Any]
Receipt = JsonDict
"""What ``prepare`` returns: small, JSON-serialisable, stored in ``decided(N)``."""


class TxnState(enum.Enum):
    """What ``probe`` can tell about a transaction ID."""

    ABSENT = "absent"
    OPEN = "open"
    PREPARED = "prepared"
    COMMITTED = "committed"
    UNKNOWN = "unknown"


class CommitLocation(enum.Enum):
    """Where phase 2 runs."""

    DRIVER = "driver"
    """The system can commit a prepared transaction by ID from any process."""
    TASKS = "tasks"
    """Commit must run in a Spark task (e.g. it re-publishes staged data)."""


@dataclass(frozen=True)
class Transaction:
    """One participant's transaction in one batch.

    ``txn_id`` is a deterministic function of (query, sink, partition, slot); the
    batch and attempt are carried for logging and for connectors that embed them.
    """

    txn_id: str
    query_key: str
    sink: str
    batch_id: int
    partition: int
    slot: int
    attempt: str = ""

    def describe(self) -> str:
        return f"{self.txn_id} (batch {self.batch_id}, partition {self.partition})"


H = TypeVar("H")


class TransactionalSink(ABC, Generic[H]):
    """Base class of every sparkeos sink. ``H`` is the connector's handle type."""

    guarantees: ClassVar[frozenset[Guarantee]] = frozenset(Guarantee)
    """The guarantees this sink can give; the coordinator refuses stronger requests."""
    commit_location: ClassVar[CommitLocation] = CommitLocation.DRIVER
    accepts_schema_change: ClassVar[bool] = False
    """If False, a batch whose schema differs from the first batch's is refused."""
    secret_fields: ClassVar[frozenset[str]] = frozenset()
    """Config fields never written to the commit log or printed."""

    # -- driver, before each batch ---------------------------------------------------
    def validate(self, schema: pa.Schema) -> None:
        """Check that the batch schema fits and the destination is usable.

        Raise ``ConfigurationError`` / ``SchemaMismatchError`` naming the fix. Runs on
        the driver before anything is written.
        """

    # -- phase 1, in a task ------------------------------------------------------------
    @abstractmethod
    def begin(self, txn: Transaction) -> H:
        """Open the transaction ``txn.txn_id``, fencing any earlier attempt of it."""

    @abstractmethod
    def write(self, handle: H, batch: pa.RecordBatch) -> None:
        """Write rows into the open transaction."""

    @abstractmethod
    def prepare(self, handle: H) -> Receipt:
        """Make the writes durable but not visible; return what commit needs."""

    def abort(self, handle: H, txn: Transaction) -> None:
        """Drop an open (unprepared) transaction after a failure in the task."""
        self.rollback(txn)

    # -- phase 2 and recovery ------------------------------------------------------------
    @abstractmethod
    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        """Make a prepared transaction visible. Idempotent."""

    @abstractmethod
    def rollback(self, txn: Transaction) -> None:
        """Undo whatever exists for ``txn.txn_id``. Idempotent; unknown IDs are fine."""

    def recover_commit(self, txn: Transaction, receipt: Receipt) -> None:
        """Commit after a restart. Defaults to ``commit``."""
        self.commit(txn, receipt)

    def recover_rollback(self, txn: Transaction) -> None:
        """Roll back after a restart. Defaults to ``rollback``."""
        self.rollback(txn)

    def probe(self, txn: Transaction) -> TxnState:
        """Tell what the external system holds for ``txn`` (used by ``status``)."""
        return TxnState.UNKNOWN

    def close(self) -> None:
        """Release driver-side resources (connections used for commits)."""

    # -- identity and description ------------------------------------------------------------
    def identity(self) -> JsonDict:
        """The destination this sink writes to; it must not change under a sink name."""
        return {}

    def describe(self) -> JsonDict:
        """The sink's configuration without secrets (stored in the commit log)."""
        if not dataclasses.is_dataclass(self):
            return {}
        out: JsonDict = {}
        for f in dataclasses.fields(self):
            if f.name in self.secret_fields:
                continue
            out[f.name] = _jsonable(getattr(self, f.name))
        return out

    @classmethod
    def from_description(
        cls, description: Mapping[str, Any]
    ) -> TransactionalSink[Any]:
        """Rebuild a sink from ``describe()`` (used by ``sparkeos recover``)."""
        return cls(**dict(description))

    @property
    def type_name(self) -> str:
        return f"{type(self).__module__}.{type(self).__qualname__}"


def _jsonable(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value
