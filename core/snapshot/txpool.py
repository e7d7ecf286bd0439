"""Transaction IDs: the two-ID pool per participant, and attempt IDs derived from it.

The pool (after Jet's TransactionPoolSnapshotUtility) gives each participant (query,
sink, partition) two **participant IDs**, one per slot; batch N uses slot ``N % 2``:

    seos-<query key>-<sink>-p<partition>-s<slot>

A system whose transactional state is keyed by a name that outlives the transaction
(Kafka's ``transactional.id``) uses the participant ID: it never holds more than two
names per participant, and every attempt of a participant's commit fences the others.

Phase 1 runs as Spark tasks, and Spark may run several attempts of one task at once
(speculation, a stage retried while the old stage's tasks still run, a zombie worker).
So prepared state is keyed by an **attempt ID**, the participant ID plus where the
attempt stands:

    seos-<query key>-<sink>-p<partition>-s<slot>-b<batch>r<run>a<tag>

``run`` is the batch attempt recorded by ``begun.<run>`` (it grows across driver
restarts); ``tag`` is Spark's task attempt number within that run, bounded by the range
``begun`` records. Attempts with different IDs never touch each other's state, and an
attempt claims its ID exclusively in ``begin`` (a retried stage numbers its attempts
from 0 again, so a zombie of the old stage attempt may hold the same ID: the later
one fails and Spark retries it under the next number). So no attempt can undo what
another prepared, and every ID that any attempt of a run may have used is a function
of its ``begun`` record (an ``AttemptRange``): recovery rolls back exactly those,
whatever the partition count of each run, without asking the external system to list
unknown transactions.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

from sparkeos.core.config import validate_sink_name
from sparkeos.core.errors import CommitLogError

POOL_SIZE = 2
TXN_PREFIX = "seos"
_ATTEMPT_SUFFIX = re.compile(r"p(\d+)-s(\d+)-b(\d+)r(\d+)a(\d+)")


def query_key_for(query_id: str) -> str:
    """A short, stable key for a query (its Spark ID persists in the checkpoint)."""
    return hashlib.sha256(query_id.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Transaction:
    """One task attempt's transaction in one batch.

    ``txn_id`` is unique to this attempt; ``participant_id`` is shared by every attempt
    of the participant in this slot (see the module docstring). ``attempt`` names the
    attempt (``b<batch>r<run>a<tag>``): never empty, unique across driver restarts.
    """

    txn_id: str
    participant_id: str
    query_key: str
    sink: str
    batch_id: int
    partition: int
    slot: int
    run: int
    tag: int
    durable_identity: bool = True
    """The query key is the query's durable identity (``core.streaming.identity``). False: a key
    of this query run only, so nothing on record under any key is known to be this
    query's, and the replay rule never skips (``core.snapshot.replay``)."""

    @property
    def attempt(self) -> str:
        return f"b{self.batch_id}r{self.run}a{self.tag}"

    def describe(self) -> str:
        return (f"{self.txn_id} (batch {self.batch_id}, partition {self.partition}, "
                f"attempt {self.attempt})")


DIRECT_RUNS = range(1_000_000, 1_000_000_000)
"""Run numbers of ``at_least_once`` / ``none`` query runs: one drawn at random per query
run (those IDs are never recovered, only kept apart: a replayed batch must not reuse the
ID of a transaction an earlier run committed or left behind). Exactly-once runs count
from 0 in the commit log and never reach this range."""


@dataclass(frozen=True)
class AttemptRange:
    """Every transaction ID that one run (batch attempt) of a batch may have used; with
    ``any_direct_run``, those of every at-least-once run of the batch (``DIRECT_RUNS``),
    which can be matched (``covers``) but not listed (``transactions`` yields none)."""

    query_key: str
    sink: str
    batch_id: int
    run: int
    partitions: int
    tags: int
    any_direct_run: bool = False

    def covers(self, txn: Transaction) -> bool:
        run_matches = (txn.run in DIRECT_RUNS if self.any_direct_run
                       else txn.run == self.run)
        return (txn.query_key == self.query_key and txn.sink == self.sink
                and txn.batch_id == self.batch_id and run_matches
                and 0 <= txn.partition < self.partitions and 0 <= txn.tag < self.tags)

    def transactions(self) -> Iterator[Transaction]:
        if self.any_direct_run:
            return
        pool = TransactionPool(self.query_key, self.sink)
        for partition in range(self.partitions):
            for tag in range(self.tags):
                yield pool.transaction(self.batch_id, partition, self.run, tag)


@dataclass(frozen=True)
class TransactionPool:
    query_key: str
    sink: str
    durable_identity: bool = True
    """See ``Transaction.durable_identity``."""

    def __post_init__(self) -> None:
        validate_sink_name(self.sink)

    @staticmethod
    def slot_of(batch_id: int) -> int:
        return batch_id % POOL_SIZE

    @property
    def prefix(self) -> str:
        """What every ID of this (query, sink) starts with."""
        return f"{TXN_PREFIX}-{self.query_key}-{self.sink}-"

    def participant_id(self, partition: int, slot: int) -> str:
        if not 0 <= slot < POOL_SIZE:
            raise ValueError(f"slot {slot} outside the pool of {POOL_SIZE}")
        return f"{self.prefix}p{partition}-s{slot}"

    def transaction(self, batch_id: int, partition: int, run: int, tag: int) -> Transaction:
        return _transaction(self.query_key, self.sink, self.durable_identity, batch_id,
                            partition, run, tag)

    def parse(self, txn_id: str) -> Transaction | None:
        """The transaction ``txn_id`` names, if it is an attempt ID of this pool."""
        if not txn_id.startswith(self.prefix):
            return None
        match = _ATTEMPT_SUFFIX.fullmatch(txn_id[len(self.prefix):])
        if match is None:
            return None
        partition, slot, batch_id, run, tag = (int(g) for g in match.groups())
        txn = self.transaction(batch_id, partition, run, tag)
        return txn if txn.slot == slot and txn.txn_id == txn_id else None

    def check_slot_free(self, batch_id: int, unresolved_batches: list[int]) -> None:
        """Refuse to start ``batch_id`` while another batch still holds its slot."""
        slot = self.slot_of(batch_id)
        holders = [b for b in unresolved_batches if b != batch_id and self.slot_of(b) == slot]
        if holders:
            raise CommitLogError(
                f"transaction slot {slot} is still held by unfinished batch {holders[0]}; "
                "starting another batch on it could lose that batch's transactions",
                sink=self.sink,
                batch_id=batch_id,
                fix="run `sparkeos recover <checkpointLocation>` (or restart the query, "
                "which recovers first) so the earlier batch is committed or rolled back",
            )


@functools.lru_cache(maxsize=4096, typed=True)
def _transaction(query_key: str, sink: str, durable_identity: bool, batch_id: int,
                 partition: int, run: int, tag: int) -> Transaction:
    # Recovery, sweeps and phase 2 name a batch's decided transactions again and again
    # (in the model check, building them took a twentieth of the time); a Transaction
    # is immutable, so one made before serves. Keyed by the pool's fields, not the
    # pool: its dataclass hash would double the cost of a lookup.
    pool = TransactionPool(query_key, sink, durable_identity)
    slot = pool.slot_of(batch_id)
    participant = pool.participant_id(partition, slot)
    return Transaction(
        txn_id=f"{participant}-b{batch_id}r{run}a{tag}",
        participant_id=participant,
        query_key=query_key,
        sink=sink,
        batch_id=batch_id,
        partition=partition,
        slot=slot,
        run=run,
        tag=tag,
        durable_identity=durable_identity,
    )
