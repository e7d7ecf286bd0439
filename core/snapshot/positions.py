"""The replay rule of real-time mode: a row is known by its position in its partition.

In real-time mode (``trigger(realTime=...)``) a task reads its source partition until
the epoch's time is up, and Spark records where the epoch ended only after its tasks
finished. A driver that dies after some tasks committed epoch N replays N from the same
start, but the replay ends wherever its own time runs out: partition p may now hold
fewer rows than the attempt that committed, or more. Comparing fingerprints of whole
(partition, epoch) participants (``core.snapshot.replay``) would refuse every such
replay. So here a row is known by its **position**: how many rows its writer partition
had seen, since the query began, before it. A replay starts at the same position as the
attempt it replays, and if the pipeline hands the partition its rows in a deterministic
order (a stateless pipeline over a replayable source, no shuffle), position q holds the
same row in every attempt.

Each (partition, epoch) attempt commits its rows with the partition's ``Mark``: where
its epoch started and ended, the highest position ever committed (``through``), and a
``Digest`` of the rows up to each of those. The digest is additive and keyed by
position, so it can be carried across an epoch boundary and compared later.

``EpochPositions`` is one attempt: ``take`` gives the rows of each batch that must be
written (a row below ``through`` was committed before and is skipped), checking the
skipped rows against the digest once the attempt reaches ``through``; ``finish`` gives
what is left to write and the mark to commit with it. A replay whose rows differ:
exactly-once raises ``ReplayMismatchError`` and writes nothing more; at-least-once
writes every row it cannot check (it may duplicate, never lose).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from sparkeos.core.errors import CommitLogError, ReplayMismatchError
from sparkeos.core.observe import log_event

from .fingerprint import row_hashes, salted_sum

_MOD = 2**64


@dataclass(frozen=True)
class Digest:
    """A hash of the rows at positions ``[0, n)``: the sum, in two 64-bit lanes, of each
    row's 64-bit hash mixed with its position. Two different rows at one position match
    by accident with a chance of about 2**-64 (their row hashes must be equal)."""

    lanes: tuple[int, int] = (0, 0)

    def plus(self, hashes: np.ndarray, first: int) -> Digest:
        """This digest followed by rows whose hashes are ``hashes``, the first at
        position ``first``."""
        if not len(hashes):
            return self
        positions = np.arange(first, first + len(hashes), dtype=np.uint64)
        return Digest((
            (self.lanes[0] + salted_sum(hashes, positions, 0)) % _MOD,
            (self.lanes[1] + salted_sum(hashes, positions, 1)) % _MOD))

    def text(self) -> str:
        return f"{self.lanes[0]:016x}{self.lanes[1]:016x}"

    @classmethod
    def parse(cls, text: str) -> Digest:
        if len(text) != 32:
            raise ValueError(f"a digest is 32 hex digits, not {text!r}")
        return cls((int(text[:16], 16), int(text[16:], 16)))


@dataclass(frozen=True, order=True)
class AttemptOf:
    """Which attempt of a (partition, epoch) this is: Spark's ID of the query's run
    (``run``; it changes with every start of the query) and the task attempt's ID
    (``task``: Spark numbers every task attempt of an application in the order it
    starts them, so of two attempts of one task in one run, the later has the higher)."""

    run: str
    task: int

    def as_json(self) -> dict[str, Any]:
        return {"run": self.run, "task": self.task}

    @classmethod
    def from_json(cls, data: Any) -> AttemptOf:
        return cls(str(data["run"]), int(data["task"]))


@dataclass(frozen=True)
class Mark:
    """What a partition has committed, written in the same transaction as an attempt's
    rows: the attempt's ``epoch``, the positions where it began and ended, and the
    highest position ever committed, each with the digest of the rows before it; and
    which attempt committed it (``by``; None where the task did not say)."""

    epoch: int
    start: int
    end: int
    through: int
    digest_start: Digest
    digest_end: Digest
    digest_through: Digest
    by: AttemptOf | None = None

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "epoch": self.epoch, "start": self.start, "end": self.end,
            "through": self.through, "digest_start": self.digest_start.text(),
            "digest_end": self.digest_end.text(), "digest_through": self.digest_through.text()}
        if self.by is not None:
            data["by"] = self.by.as_json()
        return data

    @classmethod
    def from_json(cls, data: Any) -> Mark:
        """The mark a destination holds; a ``CommitLogError`` if it is not one (what is
        committed cannot be known, so nothing may be skipped or written)."""
        try:
            by = AttemptOf.from_json(data["by"]) if data.get("by") is not None else None
            mark = cls(int(data["epoch"]), int(data["start"]), int(data["end"]),
                       int(data["through"]), Digest.parse(data["digest_start"]),
                       Digest.parse(data["digest_end"]), Digest.parse(data["digest_through"]),
                       by)
        except (KeyError, TypeError, ValueError) as exc:
            raise CommitLogError(
                f"a real-time mark cannot be read ({exc!r}): {data!r:.200}",
                fix="the marker was written by something else than this sparkeos; give "
                "the writer another name, or remove the marker if nothing of this query "
                "is committed") from exc
        if not mark.start <= mark.end <= mark.through or mark.epoch < 0:
            raise CommitLogError(
                f"a real-time mark is inconsistent: {mark.as_json()}",
                fix="the marker was written by something else than this sparkeos; give "
                "the writer another name")
        return mark


@dataclass(frozen=True)
class Resume:
    """Where an attempt of an epoch starts: the position of its first row, the digest
    of the rows before it, and whether the epoch committed before (a replay)."""

    position: int
    digest: Digest
    replay: bool


def resume(mark: Mark | None, epoch: int, *, sink: str, partition: int) -> Resume:
    """Where an attempt of ``epoch`` starts, by the partition's ``mark``. The mark of
    the epoch before is the one Spark recorded: the last attempt of an epoch is the last
    to commit (the newest attempt's transaction fences every older one)."""
    if mark is None:
        return Resume(0, Digest(), replay=False)
    if mark.epoch == epoch:
        return Resume(mark.start, mark.digest_start, replay=True)
    if mark.epoch < epoch:
        return Resume(mark.end, mark.digest_end, replay=False)
    raise CommitLogError(
        f"epoch {epoch} of partition {partition} is running, but epoch {mark.epoch} of it "
        "is committed already: the query's checkpoint was restored from an older copy",
        sink=sink, batch_id=epoch,
        fix="restart from the checkpoint that committed those epochs, or give this query's "
        "writer a new name (exactly_once_writer(..., name=...)) to write everything again")


def superseded(mark: Mark | None, epoch: int, attempt: AttemptOf | None) -> bool:
    """Whether a later attempt of this (partition, epoch), or of a later epoch, in this
    same run of the query has committed already: this attempt is then one Spark no
    longer counts (it was counted lost and ran on, a zombie) and must not commit. Spark
    counts the newest attempt of a task, and that one's end is where the next epoch
    starts: a zombie's commit would move the mark to its own end (found by the model
    check, ``sparkeos.testing.modelcheck.realtime``). An attempt of another run is a
    replay after a restart, which the positions decide."""
    return (mark is not None and attempt is not None and mark.by is not None
            and mark.epoch >= epoch and mark.by.run == attempt.run and mark.by > attempt)


@dataclass
class EpochPositions:
    """One attempt of one (partition, epoch): which rows it writes, and its mark."""

    mark: Mark | None
    epoch: int
    exactly_once: bool
    sink: str
    partition: int
    attempt: AttemptOf | None = None
    start: int = field(init=False)
    digest_start: Digest = field(init=False)
    position: int = field(init=False)
    digest: Digest = field(init=False)
    through: int = field(init=False)
    digest_through: Digest = field(init=False)
    replay: bool = field(init=False)
    skipped: int = 0
    _held: list[pa.RecordBatch] = field(default_factory=list)
    """At-least-once: skipped rows not checked yet (written if they cannot be)."""

    def __post_init__(self) -> None:
        start = resume(self.mark, self.epoch, sink=self.sink, partition=self.partition)
        self.start, self.digest_start, self.replay = start.position, start.digest, start.replay
        self.position, self.digest = start.position, start.digest
        self.through = self.mark.through if self.mark else 0
        self.digest_through = self.mark.digest_through if self.mark else Digest()

    @property
    def checking(self) -> bool:
        """Rows committed before are still ahead of this attempt."""
        return self.position < self.through

    def take(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        """The rows of ``batch`` (the next rows of the partition) to write now, in
        order. Rows below ``through`` are skipped and checked."""
        hashes = row_hashes(batch)
        seen = min(batch.num_rows, max(0, self.through - self.position))
        out: list[pa.RecordBatch] = []
        if seen:
            self.digest = self.digest.plus(hashes[:seen], self.position)
            self.position += seen
            self.skipped += seen
            if not self.exactly_once:
                self._held.append(batch.slice(0, seen))
            if self.position == self.through:
                out += self._checked()
        if seen < batch.num_rows:
            self.digest = self.digest.plus(hashes[seen:], self.position)
            self.position += batch.num_rows - seen
            out.append(batch.slice(seen))
        return [b for b in out if b.num_rows]

    def finish(self) -> tuple[list[pa.RecordBatch], Mark]:
        """At the attempt's end: rows still to write (at-least-once rows it could not
        check), and the mark to commit with what it wrote."""
        rest: list[pa.RecordBatch] = []
        if self.checking and self._held:
            # At-least-once: the epoch ended before the committed rows did, so the rows
            # skipped cannot be checked; they are written (a duplicate, not a loss) and
            # what was committed beyond this end will be written again as well.
            rest, self._held = [b for b in self._held if b.num_rows], []
            self.through, self.digest_through = self.position, self.digest
        through = max(self.through, self.position)
        digest_through = self.digest if self.position >= self.through else self.digest_through
        return rest, Mark(self.epoch, self.start, self.position, through,
                          self.digest_start, self.digest, digest_through, self.attempt)

    def _checked(self) -> list[pa.RecordBatch]:
        """The attempt reached ``through``: the skipped rows must be the ones committed."""
        held, self._held = self._held, []
        if self.digest == self.digest_through:
            return []
        problem = (f"partition {self.partition} of epoch {self.epoch} replays other rows than "
                   f"were committed below position {self.through}: the pipeline does not "
                   "hand this partition the same rows in the same order on a replay")
        if self.exactly_once:
            raise ReplayMismatchError(
                problem, sink=self.sink, batch_id=self.epoch,
                fix="exactly-once in real-time mode needs a deterministic pipeline per "
                "partition (stateless, over a replayable source, no shuffle): remove what "
                "reorders or changes the rows; at_least_once_writer writes a replay's "
                "other rows again instead of stopping")
        log_event("replay.nondeterministic", logging.WARNING, sink=self.sink,
                  batch=self.epoch, participant=self.partition, rows=self.skipped,
                  detail="real-time replay with other rows: written again (at-least-once)")
        return held


__all__ = ["AttemptOf", "Digest", "EpochPositions", "Mark", "Resume", "resume", "superseded"]
