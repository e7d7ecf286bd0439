"""A model check of real-time mode's per-partition protocol (``./run modelcheck --bound
realtime-small`` / ``realtime-full``).

It drives the real ``EpochWriter`` (``core.streaming.realtime``) and its replay rule
(``core.snapshot.positions``) through every schedule of a model of Spark's real-time
mode, within a bound. No driver takes part in a commit: each (partition, epoch) attempt
commits its rows with the partition's mark in one transaction of the destination, and
the claim checked here is that this is enough for a single sink.

The model of Spark, as measured (docs/research/realtime-mode-design.md): a driver run
starts after the last epoch in its commit log; each epoch runs one task per partition
from where the epoch before ended; a task reads until its time is up, so each attempt
ends wherever the exploration chooses (a replay too); when every partition's task
closed, the driver records the epoch's end offsets, then the epoch as done
(``commits/<epoch>``), then starts the next. Faults are choices made at every step:

=========  ===========================================================================
crash      the driver process dies here (at one of its steps, or while a task is at
           this step); a new run starts from the checkpoint
survive    a task of the dead run goes on running (an executor that outlives its
           driver for a while: a zombie) instead of dying with it
fail       a task attempt dies here; Spark starts the next attempt, or fails the query
           after ``max_failures`` (and the run ends; the query is restarted)
lost       Spark counts a task attempt as lost and starts the next one, but the attempt
           goes on running (a zombie in the same run)
choice     where an attempt's epoch ends (default: after every row)
=========  ===========================================================================

The destination is a model of the two connectors' transactions: ``fence="participant"``
(Kafka: an attempt's ``init_transactions`` fences every older producer of the same
``transactional.id``, which the epoch's slot of the two-ID pool names) or
``fence="partition"`` (PostgreSQL: an attempt ends every other session of its partition).
A commit of a fenced attempt fails; a commit makes its rows and the partition's mark
visible together, and the mark read is the last one committed.

Invariants: no row committed twice, at any step; once the query has read every row, every
row committed exactly once; no task or driver raises anything but the faults injected
and the fence (a ``ReplayMismatchError`` on a deterministic source, or any other error,
is a violation: the query would stick).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql import Row

from sparkeos.core.errors import AttemptFencedError
from sparkeos.core.protocol import EpochParticipant, JsonDict, Transaction
from sparkeos.core.snapshot import positions as positions_mod
from sparkeos.core.streaming import epochchecks as epochchecks_mod
from sparkeos.core.streaming import identity as identity_mod
from sparkeos.core.streaming import realtime as realtime_mod

from ..epochsinks import EpochOnlySink, TaskContextOf
from .mutants import _patched
from .scheduler import Actor, Budget, Killed, Scheduler, TaskDied, next_prefix

CHECKPOINT = "model://realtime-checkpoint"
SINK = "rt"
FAULTS = ("crash", "survive", "fail", "lost", "choice")


@dataclass(frozen=True)
class EpochScenario:
    name: str
    partitions: int = 1
    rows: int = 3
    """Rows of each source partition; the query ends once an epoch read them all."""
    epochs: int = 3
    """Epochs at most: the last one reads every row left (a bound on the schedules)."""
    fence: str = "participant"
    lost_replies: bool = True
    """A step after each commit applied, before its task goes on: a fault there is a
    commit whose reply was lost."""
    max_failures: int = 2
    restarts: int = 3


@dataclass
class Attempt:
    run: int
    epoch: int
    partition: int
    number: int
    lost: bool = False
    """Spark no longer counts it (it was lost, or its run died): a zombie if it runs."""
    opened: bool = False

    task_id: int = 0
    """Spark's ID of the task attempt: in the order attempts start, within the run."""

    def context(self) -> TaskContextOf:
        return TaskContextOf(f"run-{self.run}", self.task_id)


@dataclass
class Handle:
    txn: Transaction
    generation: int
    attempt: Attempt
    rows: list[int] = field(default_factory=list)


class ModelDestination(EpochParticipant[Handle]):
    """Rows and one mark per partition, changed together by a commit; attempts fenced
    as the scenario's connector fences them."""

    def __init__(self, world: RealTimeWorld) -> None:
        self.world = world
        self.committed: list[int] = []
        self.marks: dict[int, JsonDict] = {}
        self.generations: dict[Any, int] = {}

    def _fence_key(self, txn: Transaction) -> Any:
        if self.world.scenario.fence == "participant":
            return txn.participant_id
        return txn.partition

    def fenced(self, handle: Handle) -> bool:
        """A newer attempt opened since this one did (by the scenario's fence)."""
        return self.generations.get(self._fence_key(handle.txn)) != handle.generation

    def peek_mark(self, txn: Transaction) -> JsonDict | None:
        mark = self.marks.get(txn.partition)
        return dict(mark) if mark is not None else None

    def open_epoch(self, txn: Transaction) -> Handle:
        world = self.world
        world.sched.point(f"open e{txn.batch_id} p{txn.partition}")
        key = self._fence_key(txn)
        generation = self.generations.get(key, 0) + 1
        self.generations[key] = generation
        attempt = world.current_attempt()
        attempt.opened = True
        return Handle(txn, generation, attempt)

    def epoch_mark(self, handle: Handle) -> JsonDict | None:
        mark = self.marks.get(handle.txn.partition)
        return dict(mark) if mark is not None else None

    def write_epoch(self, handle: Handle, rows: pa.RecordBatch) -> None:
        handle.rows += rows.column("id").to_pylist()

    def commit_epoch(self, handle: Handle, mark: JsonDict) -> None:
        txn = handle.txn
        self.world.sched.point(f"commit e{txn.batch_id} p{txn.partition}")
        if self.fenced(handle):
            raise AttemptFencedError(f"attempt of e{txn.batch_id} p{txn.partition} fenced",
                                     sink=SINK, fix="none: a newer attempt runs")
        self.committed += handle.rows
        self.marks[txn.partition] = dict(mark)
        self.world.check_no_duplicate()
        if self.world.scenario.lost_replies:
            # The commit is applied; its reply may still be lost (the task fails, or the
            # driver dies, before Spark hears of it).
            self.world.sched.point(f"reply to the commit of e{txn.batch_id} p{txn.partition}")

    def abort_epoch(self, handle: Handle) -> None:
        handle.rows.clear()


def row_id(partition: int, position: int) -> int:
    return partition * 1000 + position


class RealTimeWorld:
    """One schedule's state: Spark's checkpoint, the destination, the actors."""

    def __init__(self, sched: Scheduler, scenario: EpochScenario) -> None:
        self.sched = sched
        self.scenario = scenario
        self.destination = ModelDestination(self)
        self.template = realtime_mod.exactly_once_writer(
            EpochOnlySink(self.destination), SINK, checkpoint_location=CHECKPOINT,
            rows_per_write=2)
        # Each attempt opens in its own turn: the scheduler runs one actor at a time, and a
        # thread of the writer's would run outside it (the order within a task, peek,
        # fence, mark, then rows, is the same).
        self.template.open_ahead = False
        self.offsets: dict[int, dict[int, int]] = {}
        """The offset log: each recorded epoch's end position per partition."""
        self.commits: set[int] = set()
        """The commit log: the epochs Spark recorded as done."""
        self.violations: list[str] = []
        self.attempts: dict[Actor, Attempt] = {}
        self.dead_runs: set[int] = set()
        self.results: dict[tuple[int, int, int], int | None] = {}
        """(run, epoch, partition) -> where the counted attempt ended; None: it failed
        ``max_failures`` times."""
        self.failures: dict[tuple[int, int, int], int] = {}
        self.runs = 0
        self.task_ids = 0
        sched.on_turn = self.on_turn

    # -- checks ------------------------------------------------------------------------------
    def check_no_duplicate(self) -> None:
        twice = sorted(i for i, n in Counter(self.destination.committed).items() if n > 1)
        if twice:
            self.violations.append(f"rows committed twice: {twice}")

    def finished(self) -> bool:
        rows = self.scenario.rows
        return any(all(self.offsets[e].get(p) == rows for p in range(self.scenario.partitions))
                   for e in self.commits)

    def check_end(self) -> None:
        if not self.finished():
            self.violations.append(f"stuck: the query did not finish in {self.runs} runs")
            return
        expected = sorted(row_id(p, q) for p in range(self.scenario.partitions)
                          for q in range(self.scenario.rows))
        missing = sorted(set(expected) - set(self.destination.committed))
        if missing:
            self.violations.append(f"rows missing at the end: {missing}")

    # -- faults ------------------------------------------------------------------------------
    def current_attempt(self) -> Attempt:
        actor = self.sched.current
        assert actor is not None
        return self.attempts[actor]

    def on_turn(self, actor: Actor, label: str) -> None:
        sched = self.sched
        if actor.kind == "driver":
            run = int(actor.name[len("driver"):])
            if run in self.dead_runs:
                raise Killed(actor.name)
            if sched.inject("crash", lambda: f"driver {run} dies before {label}"):
                self.dead_runs.add(run)
                raise Killed(actor.name)
        elif actor.kind == "task":
            attempt = self.attempts[actor]
            if attempt.run in self.dead_runs and not attempt.lost:
                self.die_or_survive(actor, attempt)
            if attempt.lost:
                return  # a zombie: the faults of the counted attempts are explored
            if sched.inject("crash", lambda: f"driver {attempt.run} dies while "
                                             f"{actor.name} is before {label}"):
                self.dead_runs.add(attempt.run)
                self.die_or_survive(actor, attempt)
                return
            if sched.inject("fail", lambda: f"{actor.name} dies before {label}"):
                self.task_failed(attempt)
                raise TaskDied(actor.name)
            if sched.inject("lost", lambda: f"{actor.name} counted lost before {label}"):
                self.task_failed(attempt)
                attempt.lost = True

    def die_or_survive(self, actor: Actor, attempt: Attempt) -> None:
        """The attempt's driver died: it dies too, or runs on as a zombie. Only a task
        that had begun its epoch outlives its driver: one that starts after its driver
        died, and after the next run committed the same epoch, is outside the model (the
        assumption docs/realtime.md states)."""
        attempt.lost = True
        if not attempt.opened or not self.sched.inject(
                "survive", lambda: f"{actor.name} outlives its driver"):
            raise Killed(actor.name)

    def task_failed(self, attempt: Attempt) -> None:
        """Spark saw the attempt fail: the next one starts, or the query fails."""
        key = (attempt.run, attempt.epoch, attempt.partition)
        failures = self.failures[key] = self.failures.get(key, 0) + 1
        if failures >= self.scenario.max_failures:
            self.results[key] = None
        else:
            self.start_attempt(attempt.run, attempt.epoch, attempt.partition, failures)

    # -- actors ------------------------------------------------------------------------------
    def main(self) -> None:
        """The supervisor: starts driver runs until the query read every row."""
        while not self.finished() and self.runs <= self.scenario.restarts:
            run = self.runs
            self.runs += 1
            driver = self.sched.spawn(f"driver{run}", functools.partial(self.drive, run),
                                      "driver")
            self.sched.point(f"supervisor awaits driver {run}",
                             ready=functools.partial(_ended, driver))
        # Quiescence: zombies still running may commit (or be fenced) before the check.
        self.sched.point("supervisor awaits the tasks", ready=self.tasks_done)
        self.check_end()

    def tasks_done(self) -> bool:
        return all(actor.state == "done" for actor in self.attempts)

    def drive(self, run: int) -> None:
        sched, partitions = self.sched, range(self.scenario.partitions)
        sched.point("read the checkpoint")
        epoch = max(self.commits) + 1 if self.commits else 0
        while True:
            for p in partitions:
                self.start_attempt(run, epoch, p, 0)
            sched.point(f"await epoch {epoch}",
                        ready=functools.partial(self.epoch_ended, run, epoch))
            ends = {p: self.results[(run, epoch, p)] for p in partitions}
            if any(end is None for end in ends.values()):
                self.dead_runs.add(run)  # a task failed max_failures times: the query
                return                   # fails, and its other tasks are cancelled
            sched.point(f"record the offsets of epoch {epoch}")
            self.offsets[epoch] = {p: end for p, end in ends.items() if end is not None}
            sched.point(f"record epoch {epoch} as done")
            self.commits.add(epoch)
            if self.finished():
                return
            epoch += 1

    def epoch_ended(self, run: int, epoch: int) -> bool:
        """Every partition's task of the epoch ended (or the run died)."""
        return run in self.dead_runs or all(
            (run, epoch, p) in self.results for p in range(self.scenario.partitions))

    def start_attempt(self, run: int, epoch: int, partition: int, number: int) -> None:
        self.task_ids += 1
        attempt = Attempt(run, epoch, partition, number, task_id=self.task_ids)
        actor = self.sched.spawn(f"task r{run} e{epoch} p{partition} a{number}",
                                 lambda: self.run_task(attempt), "task")
        self.attempts[actor] = attempt

    def start_of(self, epoch: int, partition: int) -> int:
        return self.offsets[epoch - 1][partition] if epoch > 0 else 0

    def run_task(self, attempt: Attempt) -> None:
        sched, rows = self.sched, self.scenario.rows
        # A step of its own: the attempt may be counted lost, or its driver die, before
        # it opens, and other attempts run meanwhile.
        sched.point(f"start e{attempt.epoch} p{attempt.partition}")
        start = self.start_of(attempt.epoch, attempt.partition)
        ends = list(range(rows, start - 1, -1))
        last_epoch = attempt.epoch >= self.scenario.epochs - 1
        end = rows if last_epoch else sched.pick(ends, f"{attempt} ends at")
        writer = copy.copy(self.template)
        writer._reset()
        try:
            writer.open(attempt.partition, attempt.epoch)
            for position in range(start, end):
                writer.process(Row(id=row_id(attempt.partition, position)))
            writer.close(None)
        except AttemptFencedError:
            if not attempt.lost:
                self.task_failed(attempt)
            return
        except Exception:
            if attempt.lost:
                return  # whatever a zombie meets is harmless but for what it commits
            raise
        if not attempt.lost:
            self.results[(attempt.run, attempt.epoch, attempt.partition)] = end


def _ended(actor: Actor) -> bool:
    return actor.state == "done"


@contextlib.contextmanager
def model_checkpoint(world_of: Callable[[], RealTimeWorld | None]) -> Iterator[None]:
    """The writer asks the model's commit log whether Spark recorded an epoch, and knows
    the query by a fixed ID (no files are read)."""
    recorded = realtime_mod._spark_recorded
    saved = dict(identity_mod._CHECKPOINT_IDS)

    def spark_recorded(checkpoint: str, epoch: int) -> bool:
        world = world_of()
        assert world is not None and checkpoint == CHECKPOINT
        return epoch in world.commits

    def task_context() -> TaskContextOf:
        world = world_of()
        assert world is not None
        return world.current_attempt().context()

    task_context_of = realtime_mod._task_context
    records = realtime_mod._record_writer, realtime_mod._record_partition
    realtime_mod._spark_recorded = spark_recorded  # type: ignore[assignment]
    realtime_mod._task_context = task_context  # type: ignore[assignment]
    realtime_mod._record_writer = lambda *args: None  # type: ignore[assignment]
    realtime_mod._record_partition = lambda *args: None  # type: ignore[assignment]
    identity_mod._CHECKPOINT_IDS[CHECKPOINT] = identity_mod.QueryIdentity(
        "model-query", "the model's checkpoint")
    try:
        yield
    finally:
        realtime_mod._spark_recorded = recorded  # type: ignore[assignment]
        realtime_mod._task_context = task_context_of  # type: ignore[assignment]
        realtime_mod._record_writer, realtime_mod._record_partition = records
        identity_mod._CHECKPOINT_IDS.clear()
        identity_mod._CHECKPOINT_IDS.update(saved)


def _budget(total: int, delays: int, **kinds: int) -> Budget:
    return Budget(delays=delays, total=total, kinds={k: kinds.get(k, total) for k in FAULTS})


@dataclass(frozen=True)
class RealTimeBound:
    name: str
    runs: tuple[tuple[EpochScenario, Budget], ...]


SMALL = RealTimeBound("realtime-small", (
    (EpochScenario("kafka", rows=2, epochs=2), _budget(total=2, delays=2)),
    (EpochScenario("postgres", rows=2, epochs=2, fence="partition", lost_replies=False),
     _budget(total=2, delays=2)),
))
"""Runs in the test suite (about 12,000 schedules): two epochs of two rows with every
pair of faults and two scheduling delays (lost replies with Kafka's fence)."""

FULL = RealTimeBound("realtime-full", (
    (EpochScenario("kafka", rows=3, epochs=3), _budget(total=2, delays=2)),
    (EpochScenario("postgres", rows=3, epochs=3, fence="partition"),
     _budget(total=2, delays=2)),
    (EpochScenario("kafka-two-partitions", partitions=2, rows=2, epochs=2),
     _budget(total=2, delays=1)),
))
"""``./run modelcheck --bound realtime-full``: three epochs of three rows, and two
partitions."""

BOUNDS = {b.name: b for b in (SMALL, FULL)}


def _resume_at_end(mark: Any, epoch: int, *, sink: str, partition: int) -> Any:
    if mark is not None and mark.epoch == epoch:
        return positions_mod.Resume(mark.end, mark.digest_end, replay=True)
    return _resume(mark, epoch, sink=sink, partition=partition)


_resume = positions_mod.resume

MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "zombie-commits": lambda: _patched(epochchecks_mod, "superseded", lambda *_: False),
    "unfenced-destination": lambda: _patched(ModelDestination, "fenced",
                                             lambda *_: False),
    "replay-resumes-at-its-end": lambda: _patched(positions_mod, "resume", _resume_at_end),
}
"""Bugs the model check must find, put back one at a time: an attempt that a later one of
its run superseded commits anyway (the rule ``positions.superseded`` decides); a
destination that does not fence an older attempt's commit; a replay that starts where
the committed attempt ended instead of where it began."""


@dataclass
class RealTimeReport:
    bound: str
    schedules: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, list[str], list[str]]] = field(default_factory=list)

    def summary(self) -> str:
        return (f"real-time model check ({self.bound}): schedules={self.schedules} "
                f"violations={len(self.failures)} in {self.seconds:.1f} s")


def run_schedule(scenario: EpochScenario, prefix: list[int], budget: Budget,
                 current: list[RealTimeWorld]) -> tuple[Scheduler, RealTimeWorld]:
    """One schedule; ``current`` holds its world while it runs (``model_checkpoint``)."""
    sched = Scheduler(prefix, budget)
    world = RealTimeWorld(sched, scenario)
    current[:] = [world]
    sched.run(world.main)
    for actor in sched.actors:
        if actor.error is not None and not isinstance(actor.error, TaskDied):
            world.violations.append(f"{actor.name} raised {actor.error!r}")
    return sched, world


def explore(bound: RealTimeBound, mutant: str | None = None,
            stop_on_first: bool = False) -> RealTimeReport:
    report = RealTimeReport(bound.name)
    started = time.monotonic()
    current: list[RealTimeWorld] = []
    patch = MUTANTS[mutant] if mutant else contextlib.nullcontext
    with model_checkpoint(lambda: current[-1] if current else None), patch():
        for scenario, budget in bound.runs:
            prefix: list[int] | None = []
            while prefix is not None:
                sched, world = run_schedule(scenario, prefix, budget, current)
                report.schedules += 1
                if world.violations:
                    report.failures.append((scenario.name, world.violations, sched.trace))
                    if stop_on_first:
                        break
                prefix = next_prefix(sched.choices)
            if stop_on_first and report.failures:
                break
    report.seconds = time.monotonic() - started
    return report


__all__ = ["BOUNDS", "FULL", "MUTANTS", "SMALL", "EpochScenario", "RealTimeBound", "explore"]
