"""The replay rule: the one place that decides whether a participant may write nothing
because its rows are already committed. Every connector asks it; none decides by itself.

Spark replays a batch's input, not its partitioning nor its order: after a restart on
fewer cores or with another ``repartition``, partition ``p`` of the replay may hold
other rows than partition ``p`` of the run that committed. A connector keeps, with each
commit, a record of what it wrote (``core.snapshot.fingerprint.Written``, a hash of the multiset
of rows), and hands the rule what it finds on record for its participant
(``OnRecord``). Two questions, one rule:

* **phase 1** (``replay``: an at-least-once task that commits its own transaction, or a
  task that finds a concurrent attempt committed before it): skip only when the query
  has a durable identity (``Transaction.durable_identity``: otherwise nothing on record
  is known to be this query's) and either the same rows are on record for this (batch,
  participant), or a later batch of the participant is (this attempt is a zombie of a
  batch Spark has moved past). Everything else writes (at-least-once may duplicate,
  never lose); a record of other rows is reported (``replay.nondeterministic``).
* **phase 2** (``committed_before``: a decided transaction about to be committed, by the
  driver, a retried call, a twin or a recovery): committed when a later batch of the
  participant is on record (under exactly-once a batch's commits start only once the
  batch before it finished: ``core.snapshot.overlap``), when the record names this very
  transaction, or this batch with the same rows. This batch with other rows was
  an at-least-once run's commit (the query moved to exactly-once over a half-written
  batch): reported, and the decided rows are committed too. A record that cannot be
  compared (no fingerprint on one side) cannot be decided: exactly-once refuses
  (``ReplayUndecidableError``) rather than risk a duplicate or a loss.

The driver side (``note_replays``) reads what the tasks' receipts say.

Real-time mode has its own rule, ``core.snapshot.positions``: there a replayed epoch
ends wherever its time runs out, not where the attempt that committed ended, so a row
is known by its position in its partition rather than a participant by its batch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparkeos.core.errors import ReplayUndecidableError
from sparkeos.core.observe import BatchMetrics, log_event

from .fingerprint import Written
from .txpool import DIRECT_RUNS, Transaction

REPLAY_KEY = "replay"
"""The receipt field a participant that met an earlier commit of its (batch, partition)
fills with ``Replay.receipt()``."""
NOTHING = -1


@dataclass(frozen=True)
class OnRecord:
    """What a destination holds on record as committed for a participant: the latest
    ``batch`` committed under it (``NOTHING``: none), and what each commit of that batch
    wrote (``written``; None for a commit whose content is unknown, such as a marker
    written before fingerprints were recorded)."""

    batch: int
    written: tuple[Written | None, ...] = ()
    txn_ids: tuple[str, ...] = ()
    """The attempt IDs the records of ``batch`` name, where they name one: a decided
    transaction on record by its own ID is committed, fingerprints or not."""

    @classmethod
    def nothing(cls) -> OnRecord:
        return cls(NOTHING)

    @classmethod
    def last_batch(cls, batch: int, written: Written | None,
                   txn_id: str | None = None) -> OnRecord:
        """A record kept per participant (a Kafka marker, a STOMP PUBLISHED record):
        the last batch committed under it, what that commit wrote and, where recorded,
        the attempt that committed it."""
        if batch == NOTHING:
            return cls(NOTHING)
        return cls(batch, (written,), (txn_id,) if txn_id else ())

    @classmethod
    def of_batch(cls, batch: int, written: Iterable[Written | None]) -> OnRecord:
        """Records kept per (batch, partition) (PostgreSQL's marker rows): every commit
        of ``batch`` on record."""
        commits = tuple(written)
        return cls(batch if commits else NOTHING, commits)

    def of(self, txn: Transaction) -> tuple[Written | None, ...]:
        """What was committed for ``txn``'s own batch."""
        return self.written if self.batch == txn.batch_id else ()

    def names(self, txn: Transaction) -> bool:
        """A record of ``txn``'s batch names ``txn`` itself."""
        return self.batch == txn.batch_id and txn.txn_id in self.txn_ids

    def later_than(self, txn: Transaction) -> bool:
        return self.batch > txn.batch_id


@dataclass(frozen=True)
class Replay:
    """What a participant wrote (``written``) against what is on record for its batch
    (``recorded``), and whether the rule lets it write nothing (``skip``)."""

    written: Written
    recorded: tuple[Written | None, ...]
    later: bool = False
    """A later batch of the participant is on record."""
    durable_identity: bool = True

    @property
    def same(self) -> bool:
        """The same rows are on record as committed for this batch."""
        return any(self.written.same_as(r) for r in self.recorded)

    @property
    def skip(self) -> bool:
        """Write nothing: the one case where nothing can be lost."""
        return self.durable_identity and (self.later or self.same)

    @property
    def met_earlier_commit(self) -> bool:
        return bool(self.recorded) or self.later

    def receipt(self) -> dict[str, Any]:
        return {"same": self.same, "skipped": self.skip, "rows": self.written.rows,
                "recorded_rows": [None if r is None else r.rows for r in self.recorded]}

    def receipt_fields(self) -> dict[str, Any]:
        """``{REPLAY_KEY: receipt()}`` when an earlier commit of the batch was met."""
        return {REPLAY_KEY: self.receipt()} if self.met_earlier_commit else {}


def replay(txn: Transaction, written: Written, on_record: OnRecord) -> Replay:
    """Phase 1: may this participant, about to commit ``written``, write nothing?"""
    return Replay(written, on_record.of(txn), on_record.later_than(txn),
                  txn.durable_identity)


def committed_before(txn: Transaction, written: Written | None, on_record: OnRecord) -> bool:
    """Phase 2: is the decided transaction ``txn`` (whose phase 1 wrote ``written``)
    already committed, by what is on record for its participant? An at-least-once task
    committing its own transaction (a run of ``DIRECT_RUNS``) asks the phase-1 rule."""
    if txn.run in DIRECT_RUNS or not txn.durable_identity:
        return written is not None and replay(txn, written, on_record).skip
    if on_record.later_than(txn) or on_record.names(txn):
        return True
    recorded = on_record.of(txn)
    if not recorded:
        return False
    if written is None or any(r is None for r in recorded):
        raise ReplayUndecidableError(
            f"batch {txn.batch_id} of participant {txn.participant_id} is on record as "
            "committed, but what was committed cannot be compared with what was decided "
            "(a receipt or marker written by a sparkeos that recorded no fingerprints): "
            "committing again could duplicate the rows, skipping could lose them",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="finish this batch with the sparkeos version that decided it (`sparkeos "
            "recover <checkpointLocation>`), then upgrade; or check the destination for "
            "the batch's rows and, if they are there, move the sink's commit log aside")
    if any(written.same_as(r) for r in recorded):
        return True
    log_event("replay.nondeterministic", logging.WARNING, sink=txn.sink,
              batch=txn.batch_id, participant=txn.partition, rows=written.rows,
              recorded_rows=[None if r is None else r.rows for r in recorded],
              detail="batch committed before with other rows (an at-least-once run): "
              "the decided rows are committed too")
    return False


def note_replays(sink: str, query_key: str, batch_id: int,
                 results: Sequence[Mapping[str, Any]], metrics: BatchMetrics) -> None:
    """On the driver, after phase 1 (or a direct batch): count the participants that met
    an earlier commit of their (batch, partition), and report those whose rows differ
    from it (a replay partitioned otherwise, or a nondeterministic input)."""
    for result in results:
        receipt = result.get("receipt")
        found = result.get(REPLAY_KEY) or (
            receipt.get(REPLAY_KEY) if isinstance(receipt, Mapping) else None)
        if not isinstance(found, Mapping):
            continue
        if found.get("skipped", found.get("same")):
            metrics.replays_skipped += 1
            continue
        metrics.replays_rewritten += 1
        log_event("replay.nondeterministic", logging.WARNING, query=query_key, sink=sink,
                  batch=batch_id, participant=result.get("partition"),
                  rows=found.get("rows"), recorded_rows=found.get("recorded_rows"),
                  detail="an earlier run committed other rows for this (batch, "
                  "partition): written again, rows both runs hold may be duplicated")


__all__ = ["REPLAY_KEY", "OnRecord", "Replay", "committed_before", "note_replays", "replay"]
