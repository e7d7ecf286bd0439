"""The participant contract a connector author implements.

A sink is one class. The coordinator (never the connector) decides when each hook
runs; the order per guarantee is:

exactly-once (``exactly_once(sink, name=...)``)::

    driver   validate(schema)                       once per batch, before anything
    driver   [commit log: begun(N, run, partitions, attempt range)]
    task     every attempt of partition p gets its own Transaction (its own txn_id):
             h = begin(txn); write(h, batch)...; receipt = prepare(h)
             (on an error in the task: abort(h, txn), then the error propagates)
    driver   before_decision(N, receipts)            may refuse: the run is aborted
    driver   [commit log: outcome(N, run) = decided(one receipt per partition)]
             the point of no return; one outcome per run, first writer wins
    driver*  commit(txn, receipt) for every decided attempt   (* in tasks if
                                                              commit_location is TASKS)
             (a sink that ``merges_commits``, phase 2 in one process:
             ``commit_merged(items)`` for each committer ``commit_groups`` named
             in the decision)
    driver   [commit log: finished(N)]
    driver   sweep(every run of N, keep=the decided IDs): rolls back what the other
             attempts of N left (speculative copies, retried tasks, late zombies)
    recovery decided but not finished: recover_commit(txn, receipt), then finished;
             begun without an outcome: outcome(N, run) = aborted, then sweep

at-least-once / none::

    task     h = begin(txn); write(h, ...); receipt = prepare(h); commit(txn, receipt)

Rules every implementation must keep (the conformance suite checks them):

* Attempts are concurrent. Spark may run several attempts of one task at once; each
  has its own ``txn_id``. ``begin``, ``write``, ``prepare`` and ``abort`` touch only
  their own attempt's state, never another ID's. If the destination serialises
  attempts (a row lock), ``begin`` may wait or fail.
* The replay rule (``core.snapshot.replay``). An attempt may write nothing because its (batch,
  partition) was committed before only when what was committed holds the same rows
  (``core.snapshot.fingerprint.Written``, recorded with the marker): Spark replays a batch's
  input, not its partitioning, so partition ``p`` of a replay may hold other rows than
  the partition ``p`` that committed. Decide at ``prepare``, say so in the receipt
  (``REPLAY_KEY``); otherwise write again (at-least-once may duplicate, never lose).
* ``begin`` claims its ``txn_id`` exclusively: when another attempt already holds the
  same ID (a zombie of a retried stage, whose attempt numbers restart at 0), ``begin``
  or ``prepare`` raises ``AttemptFencedError`` and never writes into that attempt's
  state. Spark retries the task under the next attempt number.
* ``prepare`` makes the writes durable but invisible; after it returns, ``commit``
  must succeed with only ``txn`` and ``receipt`` in hand, from another process,
  after the writer died.
* ``commit`` is idempotent: committing an already committed transaction is a no-op.
  If the prepared state is gone and the work is not visible, raise ``DataLossError``.
* ``commit`` may run twice at once for the same transaction (the driver and ``sparkeos
  recover --force``; a retried call that went through): every step is safe against
  its twin (claim with a conditional write or a row lock; after losing a race, look
  again; never read "gone" as "lost" before checking that the twin finished). Mark the
  steps with ``core.steps.commit_step`` so the conformance suite can interleave them.
* ``rollback`` undoes whatever exists for ``txn.txn_id``, and only that; it is
  idempotent and must accept IDs that were never used. Only the coordinator calls it
  (through ``sweep``), for IDs the commit log says can never be committed.
* Zombies are fenced by construction: only IDs named by ``decided(N)`` are ever
  committed, and the sweeps roll back the rest, including state a zombie prepares
  after its batch was decided or aborted.
* Receipts are small JSON objects (they are stored in the commit log).

Sinks are pickled to Spark's Python workers: keep connections out of ``__init__``
(open them lazily) and make configs frozen dataclasses validated at construction.
"""

from __future__ import annotations

import dataclasses
import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar

import pyarrow as pa

from sparkeos.core.snapshot.txpool import AttemptRange, Transaction

from .config import Guarantee

__all__ = [
    "AttemptRange",
    "CommitLocation",
    "EpochParticipant",
    "JsonDict",
    "Receipt",
    "Transaction",
    "TransactionalSink",
    "TxnState",
]

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
    commit_steps: ClassVar[tuple[str, ...]] = ()
    """The names of the ``core.steps.commit_step(name, txn)`` calls inside ``commit`` /
    ``recover_commit``, in order: the conformance suite pauses one of two concurrent
    committers of the same transaction at each of them (see ``core/steps.py``)."""

    # -- driver, once -------------------------------------------------------------------
    def for_guarantee(self, guarantee: Guarantee) -> TransactionalSink[H]:
        """The sink the coordinator runs under ``guarantee`` (one it offers). Default:
        ``self``. Override when a weaker guarantee has a cheaper path, e.g. a plain
        commit in the task instead of a prepared transaction; return a copy, never
        mutate ``self``."""
        return self

    def cluster_by(self) -> tuple[str, ...]:
        """DataFrame columns whose equal values must reach one participant, e.g. an
        upsert key: two prepared transactions of one batch holding the same row would
        wait on each other until the lock timeout. The batch is hash-partitioned by
        these columns (into as many partitions as it has) before phase 1. Default:
        none, the batch keeps its partitioning."""
        return ()

    def task_columns(self) -> tuple[str, ...]:
        """Spark SQL expressions the batch is projected to before phase 1
        (``selectExpr``), so that encoding runs in the JVM, e.g.
        ``("to_json(struct(*)) AS _json",)``. Default: none, tasks get the batch's own
        columns. ``validate`` and schema pinning still see the batch's own schema;
        runners without Spark (in-process tests) pass the columns unprojected, so
        ``write`` must accept both.
        """
        return ()

    # -- driver, before each batch ---------------------------------------------------
    def validate(self, schema: pa.Schema) -> None:
        """Check that the batch schema fits and the destination is usable.

        Raise ``ConfigurationError`` / ``SchemaMismatchError`` naming the fix. Runs on
        the driver before anything is written.
        """

    def shared_paths(self) -> tuple[str, ...]:
        """Directories the driver and every executor must see as one (where tasks stage
        what the driver, or another executor, commits), e.g. a staging directory on a
        mount. On a cluster they are checked from the executors once per query run,
        before the first batch (``ConfigurationError`` naming the path if one is not
        shared). Default: none."""
        return ()

    def for_checkpoint(self, location: str, sink_name: str) -> TransactionalSink[H]:
        """Driver, once per query run, before anything else: this sink with the defaults
        that depend on where the query keeps its state filled in (``location``: the
        checkpoint, shared by every driver restart; ``sink_name``: unique within it),
        e.g. a staging directory under the checkpoint. Default: ``self``."""
        return self

    def check_participants(self, count: int) -> None:
        """Driver, before phase 1: the batch has ``count`` participants of this sink.
        Raise ``ConfigurationError`` if the destination cannot hold that many open
        transactions at once (with room for a retried attempt of each). Default: no
        limit."""

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
        """Drop this attempt's writes after a failure in its task (before or after
        ``prepare``). Defaults to ``rollback(txn)``: ``txn`` is this attempt's own ID,
        so nothing another attempt wrote is touched."""
        self.rollback(txn)

    # -- driver, between the phases ---------------------------------------------------------
    def before_decision(self, batch_id: int, receipts: Sequence[Receipt]) -> None:
        """Check the prepared batch as a whole (one receipt per partition) before it is
        decided. Raise (e.g. ``ConfigurationError``) to abort the run: every prepared
        transaction is rolled back and nothing is committed. For limits only the whole
        batch shows, such as a broker's duplicate-ID window. Default: nothing."""

    # -- phase 2 and recovery ------------------------------------------------------------
    @abstractmethod
    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        """Make a prepared transaction visible. Idempotent."""

    @abstractmethod
    def rollback(self, txn: Transaction) -> None:
        """Undo whatever exists for ``txn.txn_id`` (and nothing else). Idempotent;
        unknown IDs are fine."""

    def recover_commit(self, txn: Transaction, receipt: Receipt) -> None:
        """Commit after a restart. Defaults to ``commit``."""
        self.commit(txn, receipt)

    def merges_commits(self) -> bool:
        """Whether ``commit_merged`` can make the receipts of several participants of one
        batch visible in one transaction of the destination (Kafka transactions span
        topic partitions). Then, where phase 2 runs in one process (the format route's
        commit worker, a driver), a batch is decided with each participant assigned to a
        committer (``commit_groups``; ``core.snapshot.committers``), and every commit of
        it, in any process, commits each committer's participants together. Default:
        False."""
        return False

    def commit_groups(self, receipts: Sequence[Receipt], committers: int) -> list[int]:
        """For a sink that ``merges_commits``: the committer of each receipt of one batch
        (in partition order), numbered from 0. Default: ``committers`` contiguous runs,
        as even as they divide (each participant alone when there are no more than
        ``committers``). Override it to bound what one transaction carries."""
        count = len(receipts)
        return [rank * committers // count for rank in range(count)] if count else []

    def commit_merged(self, items: Sequence[tuple[Transaction, Receipt]], *,
                      recovering: bool) -> None:
        """Make every prepared transaction of ``items`` (one committer's participants in
        partition order, as the decision grouped them) visible at once: all of them or
        none. Idempotent like ``commit``, and safe beside a twin committing the same
        items (every committer of them derives its fencing from the same items, e.g.
        Kafka's first participant with records). ``recovering``: as
        ``recover_commit``."""
        raise NotImplementedError(f"{type(self).__name__} does not merge commits")

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        """Roll back every transaction of ``ranges`` whose ID is not in ``keep``.

        The coordinator calls it for runs whose outcome is recorded: after a batch is
        committed or aborted, when its slot is reused, and on recovery. The default
        calls ``rollback`` for each of the ``partitions x tags`` IDs of every range;
        override it when the destination can find this sink's leftovers in one call
        (list a directory, one query) and keep those whose ``pool.parse(id)`` is
        covered by a range.
        """
        for attempt_range in ranges:
            for txn in attempt_range.transactions():
                if txn.txn_id not in keep:
                    self.rollback(txn)

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        """Describe committed output this destination holds under ``sink`` from another
        query (another query key), or None. Asked once, before a sink whose commit log
        has never decided a batch writes anything: a lost checkpoint would otherwise
        make the restarted query write everything again, silently. Default: None (the
        sink cannot tell)."""
        return None

    def probe(self, txn: Transaction) -> TxnState:
        """Tell what the external system holds for ``txn`` (used by ``status``)."""
        return TxnState.UNKNOWN

    def close(self) -> None:
        """Release driver-side resources (connections used for commits)."""

    def epoch_participant(self) -> EpochParticipant[Any]:
        """This sink in Spark's real-time mode (``exactly_once_writer``): one
        transaction per (partition, epoch), committed in the task with the partition's
        mark. Default: none; the writer refuses the sink with the fix."""
        from sparkeos.core.errors import ConfigurationError

        raise ConfigurationError(
            f"{type(self).__name__} cannot write in real-time mode (it has no "
            "epoch_participant)",
            fix="use a sink that can (KafkaSink, PostgresSink), or a micro-batch trigger "
            "with foreachBatch(exactly_once(...))")

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


E = TypeVar("E")


class EpochParticipant(ABC, Generic[E]):
    """A sink in Spark's real-time mode (``trigger(realTime=...)`` with
    ``exactly_once_writer``): each (partition, epoch) is one transaction of the
    destination, begun in the ForeachWriter's ``open``, fed as rows arrive, and
    committed in its ``close`` together with the partition's MARK, a small JSON object
    the writer makes (``core.snapshot.positions``). No driver decides: the mark tells
    every later attempt which of its rows were committed. The order, in one task::

        peek_mark(txn)                   optional: the committed mark, read unfenced
        h = open_epoch(txn)              fences every older attempt of txn's participant
        mark = epoch_mark(h)             the partition's last committed mark, or None
        write_epoch(h, rows)...          only rows the mark does not cover
        commit_epoch(h, mark) | abort_epoch(h)

    Rules: ``open_epoch`` must fence older attempts of the same participant (an open
    transaction of theirs is rolled back, a later commit of theirs fails);
    ``epoch_mark`` reads only committed state; ``commit_epoch`` makes the rows and the
    mark visible at once, or neither.
    """

    def epoch_rows(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows as the destination receives them, in types that do not depend on
        how the batch was cut (a row is known by this form's content). Default: the
        batch itself."""
        return batch

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        """As ``TransactionalSink.output_of_other_queries``: committed output of
        ``sink`` (this destination) from another query key, or None. Asked when a
        partition has no mark of this query yet, under exactly-once: a lost checkpoint
        would otherwise make the new query write everything again. Default: None (the
        participant cannot tell)."""
        return None

    def peek_mark(self, txn: Transaction) -> JsonDict | None:
        """The partition's last committed mark, read without fencing anyone (None: no
        mark, or none that can be read without opening). The writer asks before
        ``open_epoch`` so that an attempt a later one has superseded (a zombie) is refused
        before it fences the attempt Spark counts; the mark ``epoch_mark`` reads after
        the fence is still the one that decides. Default: None (no early refusal)."""
        return None

    def fence_epoch(self, txn: Transaction) -> None:
        """Fence every attempt of ``txn``'s participant and roll back what they left
        open, reading nothing (``sparkeos recover``). Default: open and abort."""
        self.abort_epoch(self.open_epoch(txn))

    @abstractmethod
    def open_epoch(self, txn: Transaction) -> E: ...

    @abstractmethod
    def epoch_mark(self, handle: E) -> JsonDict | None: ...

    @abstractmethod
    def write_epoch(self, handle: E, rows: pa.RecordBatch) -> None: ...

    @abstractmethod
    def commit_epoch(self, handle: E, mark: JsonDict) -> None: ...

    @abstractmethod
    def abort_epoch(self, handle: E) -> None: ...
