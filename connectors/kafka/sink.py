"""Exactly-once Kafka sink (confluent-kafka / librdkafka).

librdkafka cannot resume a prepared Kafka transaction in another process (no KIP-939),
so a Kafka transaction cannot be "prepared" in phase 1 and committed by the driver in
phase 2. The two modes deal with that differently.

``mode="staged"`` (default; exactly-once, ``commit_location = TASKS``)
    Phase 1 (task attempt): serialise the partition's records (key/value/topic/headers
    bytes) into an Arrow IPC file ``<staging_dir>/<prefix><attempt txn id>/
    records.arrow`` (a directory each attempt creates exclusively) and fsync it. The
    receipt names the file. Nothing is sent to Kafka.

    Phase 2 (a Spark task per participant, after ``decided(N)``): a transactional
    producer with ``transactional.id`` = the pool's participant ID for (query, sink,
    partition, slot) calls ``init_transactions()`` (fences every earlier producer of
    that ID, including a concurrent attempt of the same commit, and aborts what it left
    open), then reads the participant's MARKER; if it says batch N is committed,
    nothing is sent (commit is idempotent). Otherwise it begins a Kafka transaction,
    produces every staged record of the decided attempt, adds the marker to the same
    transaction and commits; then that attempt's staged file is deleted. The
    coordinator's sweep deletes what the other attempts staged. (A producer of the ID
    this process kept from the slot's last batch skips ``init_transactions``:
    ``clients``.) Where phase 2 runs in one process (the format's commit worker),
    several participants commit in one Kafka transaction, as the decision grouped them
    (``commit_merged``, ``core.snapshot.committers``): under the ID of the first one
    with staged records, with each one's marker.

    The MARKER is a consumer-group offset committed inside the Kafka transaction
    (``send_offsets_to_transaction``, KIP-98/447): group
    ``<marker_group_prefix><query>.<sink>.<destination hash>.p<partition>``, topic
    ``marker_topic`` (1 partition, created on first use), offset ``N + 1``. The broker
    makes the offset visible atomically with the records, only if the transaction
    commits; a reader with ``require_stable`` (librdkafka's ``committed()`` under
    ``read_committed``) never sees a pending one. "Batch N of participant p is
    committed" is then ``committed offset >= N + 1`` (batches of a query commit in
    order). The same transaction writes a PROGRESS record to ``marker_topic`` (key:
    the group name, value: ``{"batch": N}``); the topic is compacted, so the last
    record of every participant is kept for ever (see "Marker retention").

``mode="direct"`` (opt-in, faster; at-least-once with replay deduplication)
    Each task opens the Kafka transaction itself in phase 1, produces its partition,
    adds its marker and commits right away: no staging, no second Spark job. The
    records are visible before the batch is decided, so the coordinator's
    exactly-once contract (invariant 1) cannot hold and the sink offers only
    ``at_least_once`` / ``none``: use ``at_least_once(sink, name=...)``. A re-run of
    batch N aborts its transaction for every (batch, partition) whose marker shows the
    same rows committed (count and fingerprint, ``core.snapshot.replay``), and commits the
    others. So nothing is ever lost, and the output is exactly-once **when a re-run of
    batch N gives every partition the same rows in the same order** (a replayable
    source, the same partitioning); a partition whose rows differ is written again
    (its rows may be duplicated) and reported as ``replay.nondeterministic``.

Zombies: a commit attempt still running after a newer one started is fenced by the
newer ``init_transactions`` (epoch bump); its commit fails and its records are
aborted. Staged files of a zombie task attempt are never named by ``decided(N)`` and
are deleted by the coordinator's sweeps.

Marker retention: consumer-group offsets of an idle group are removed by the broker
after ``offsets.retention.minutes`` (default 7 days). Every commit refreshes them, so a
running query is unaffected, and within a run a commit follows its decision at once.
After a restart, when a marker offset is absent (expired while the query was down, or
never written), the recovering commit reads the progress records instead (a scan of
the compacted marker topic with ``read_committed``), so exactly-once does not depend
on the outage being short.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from sparkeos.core.config import Guarantee
from sparkeos.core.protocol import (
    CommitLocation,
    EpochParticipant,
    Receipt,
    Transaction,
    TransactionalSink,
    TxnState,
)
from sparkeos.core.snapshot.fingerprint import Fingerprint
from sparkeos.core.snapshot.txpool import AttemptRange
from sparkeos.core.storage.staging import StagingArea

# A name imported "as" itself is kept importable from here (it lived here before the
# sink was split into the modules of this package).
from . import clients, direct, markers, pool, preflight, publish
from .config import DEFAULT_MARKER_GROUP_PREFIX as DEFAULT_MARKER_GROUP_PREFIX
from .config import DEFAULT_MARKER_TOPIC as DEFAULT_MARKER_TOPIC
from .config import MODES as MODES
from .config import STAGING_ENV as STAGING_ENV
from .config import KafkaConfig, check_recorded, public_producer_config
from .errors import DRIVER
from .preflight import BROKER_MAX_TXN_TIMEOUT as BROKER_MAX_TXN_TIMEOUT
from .preflight import MARKER_TOPIC_CONFIG as MARKER_TOPIC_CONFIG
from .preflight import PUBLISH_BUDGET as PUBLISH_BUDGET
from .reader import read_topic
from .staged import CHECKPOINT_STAGING as CHECKPOINT_STAGING
from .staged import (
    STAGED_FILE,
    StagedFile,
    checkpoint_staging_dir,
    default_staging_dir,
    staging_area,
)


@dataclass
class _Handle:
    """A task attempt's phase-1 state."""

    txn: Transaction
    rows: int = 0
    staged: StagedFile | None = None
    """The file the attempt stages to (staged mode); None in direct mode."""
    producer: Any = None
    """The task's own producer, its transaction open (direct mode)."""
    marker: markers.Marker = markers.NO_MARKER
    """Direct mode: the participant's marker when the attempt began."""
    topics: set[str] = field(default_factory=set)
    """Per-row topics the attempt wrote (checked before it prepares)."""
    fingerprint: Fingerprint = field(default_factory=Fingerprint)


@dataclass(frozen=True)
class KafkaSink(KafkaConfig, TransactionalSink[_Handle]):
    """Write a foreachBatch DataFrame to Kafka, exactly once (``mode="staged"``).

    The settings, their defaults and checks are ``KafkaConfig``'s (``config.py``). This
    class is the protocol; each mechanism is a module of this package: ``preflight``
    (what is checked before the first batch and before the decision), ``staged`` (the
    files of phase 1), ``direct`` (direct mode's task transaction), ``producers`` (the
    transactional producer and retries), ``markers`` (what is committed, and the
    lost-checkpoint guard), ``publish`` (phase 2), ``errors`` (error translation).
    """

    commit_location: ClassVar[CommitLocation] = CommitLocation.TASKS
    commit_steps: ClassVar[tuple[str, ...]] = ("initialised", "checked", "produced",
                                               "committed")

    def __hash__(self) -> int:
        return hash(json.dumps(self.describe(), sort_keys=True, default=str))

    # -- identity / description ------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        return markers.identity(self)

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        public_producer_config(out, self.producer_config)
        return out

    @classmethod
    def from_description(cls, description: Mapping[str, Any]) -> KafkaSink:
        return cls(**check_recorded(description))

    def marker_group(self, txn: Transaction) -> str:
        return markers.marker_group(self, txn)

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        return markers.output_of_other_queries(self, query_key, sink)

    def for_guarantee(self, guarantee: Guarantee) -> KafkaSink:
        """Under at-least-once every transaction announces itself on the marker topic
        first (``announces_open``): the next run closes what a dead one left open."""
        if guarantee is Guarantee.EXACTLY_ONCE or self.announces_open:
            return self
        copy = dataclasses.replace(self)
        copy.__dict__["_announce_open"] = True
        return copy

    # -- driver ------------------------------------------------------------------------------
    def validate(self, schema: pa.Schema) -> None:
        self.layout().check_schema(schema)
        if self.mode == "staged":
            self._check_staging_dir()
        preflight.check_broker_once(self)

    def check_broker(self) -> None:
        """Reachability, ``transaction.timeout.ms`` limit, marker and output topics."""
        preflight.check_broker(self)

    def require_topics(self, topics: Sequence[str], txn: Transaction | None = None) -> None:
        preflight.require_topics(self, topics, txn)

    def before_decision(self, batch_id: int, receipts: Sequence[Receipt]) -> None:
        if self.mode == "staged":  # a direct-mode task committed already: no publish
            preflight.check_publish_budget(self, batch_id, receipts)

    # -- phase 1 (tasks) ---------------------------------------------------------------------
    def begin(self, txn: Transaction) -> _Handle:
        if self.mode == "staged":
            return _Handle(txn, staged=StagedFile(
                self.staging.claim(txn, self.__dict__.get("_mark"))))
        producer, marker = direct.begin(self, txn)
        return _Handle(txn, producer=producer, marker=marker)

    def write(self, handle: _Handle, batch: pa.RecordBatch) -> None:
        handle.rows += batch.num_rows
        handle.fingerprint.update(batch)
        records = self.layout().serialize(batch)
        topics = preflight.row_topics(records)
        if handle.staged is None:  # direct mode produces right away: check first
            self.require_topics(sorted(topics - handle.topics), handle.txn)
        handle.topics.update(topics)
        if handle.staged is not None:
            handle.staged.write(self.staging, records)
        else:
            direct.produce(self, handle.producer, records, handle.txn)

    def prepare(self, handle: _Handle) -> Receipt:
        self.require_topics(sorted(handle.topics), handle.txn)
        if handle.staged is not None:
            return handle.staged.seal(self.staging, handle.fingerprint.written(),
                                      self.fsync)
        producer, handle.producer = handle.producer, None
        return direct.finish(self, producer, handle.txn, handle.marker,
                             handle.fingerprint.written())

    def abort(self, handle: _Handle, txn: Transaction) -> None:
        if handle.staged is not None:
            handle.staged.discard(self.staging)
        if handle.producer is not None:
            producer, handle.producer = handle.producer, None
            direct.abort(self, producer)

    # -- phase 2 / recovery -------------------------------------------------------------------
    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        self._commit(txn, receipt, recovering=False)

    def recover_commit(self, txn: Transaction, receipt: Receipt) -> None:
        """After a restart, a marker offset may have expired while the query was down:
        then the progress record (which does not expire) says whether N is committed."""
        self._commit(txn, receipt, recovering=True)

    def merges_commits(self) -> bool:
        """Staged mode: one Kafka transaction publishes the staged files of several
        participants (it spans topic partitions), with each one's marker."""
        return self.mode == "staged"

    def commit_groups(self, receipts: Sequence[Receipt], committers: int) -> list[int]:
        """Contiguous runs as even as they divide, each cut where what it staged would
        outlast the publish budget of one transaction (``preflight``)."""
        return preflight.split_by_budget(self, receipts, super().commit_groups(
            receipts, committers))

    def commit_merged(self, items: Sequence[tuple[Transaction, Receipt]], *,
                      recovering: bool) -> None:
        """One Kafka transaction under the transactional ID of the first participant
        with staged records (every committer of the items finds the same one): every
        such participant's records, marker and progress record
        (``publish.commit_unit``). What the others claimed is deleted."""
        staged_rows = [(txn, receipt) for txn, receipt in items
                       if receipt.get("file") and receipt.get("rows")]
        for txn, receipt in items:
            if not (receipt.get("file") and receipt.get("rows")):
                self.staging.delete(txn)
        if staged_rows:
            publish.commit_unit(self, staged_rows, recovering=recovering)

    def _commit(self, txn: Transaction, receipt: Receipt, *, recovering: bool) -> None:
        if receipt.get("mode") == "direct":
            return  # committed by its task in phase 1
        if not receipt.get("file") or not receipt.get("rows"):
            self.staging.delete(txn)
            return
        publish.commit_staged(self, txn, receipt, recovering=recovering)

    def rollback(self, txn: Transaction) -> None:
        """Delete what the attempt staged. Nothing of an undecided attempt ever reached
        Kafka; a Kafka transaction a crashed commit left open under the participant's
        transactional.id is aborted by the next commit's init_transactions."""
        if self.mode == "staged":
            self.staging.delete(txn)

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        """Delete what undecided attempts staged. Before the first batch of an
        at-least-once query run (``any_direct_run`` ranges), also close every
        transaction earlier runs left open, whatever their partition count
        (``pool``)."""
        if self.mode == "staged":
            self.staging.sweep(ranges, keep)
        if ranges and any(r.any_direct_run for r in ranges):
            pool.close_open_transactions(self, ranges[0].query_key, ranges[0].sink)

    def probe(self, txn: Transaction) -> TxnState:
        if self.mode == "staged":
            if self.staging.has_file(txn, STAGED_FILE):
                return TxnState.PREPARED
            if self.staging.is_claimed(txn):
                return TxnState.OPEN
        if self._committed_batch(txn, DRIVER) >= txn.batch_id:
            return TxnState.COMMITTED
        return TxnState.ABSENT

    def close(self) -> None:
        clients.clear_caches()

    def epoch_participant(self) -> EpochParticipant[Any]:
        """Real-time mode: a Kafka transaction per (partition, epoch) (``realtime``)."""
        from .realtime import KafkaEpochs

        return KafkaEpochs(self)

    def _committed_batch(self, txn: Transaction, phase: str, recovering: bool = False) -> int:
        return markers.committed_batch(self, txn, phase, recovering)

    # -- staging -------------------------------------------------------------------------------
    def shared_paths(self) -> tuple[str, ...]:
        if self.mode != "staged" or not self.staging.needs_sharing:
            return ()
        return (self.staging.path,)

    def for_checkpoint(self, location: str, sink_name: str) -> KafkaSink:
        """Staged mode without a ``staging_dir``: stage under the query's checkpoint,
        which every driver restart finds and a cluster shares by construction."""
        if self.mode != "staged" or self.staging_dir:
            return self
        return dataclasses.replace(
            self, staging_dir=checkpoint_staging_dir(location, sink_name))

    @property
    def staging(self) -> StagingArea:
        return staging_area(self)

    def _check_staging_dir(self) -> None:
        # The driver's mark on the directory: pickled to the tasks with the sink, each
        # task checks it before it stages (a directory not shared is found there).
        self.__dict__["_mark"] = self.staging.check_on_driver(self.__dict__.get("_mark"))


__all__ = ["KafkaSink", "default_staging_dir", "read_topic"]
