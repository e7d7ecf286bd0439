"""The program the model check explores: a streaming query on a model of Spark.

A supervisor (the user, or an orchestrator) starts driver runs until the query has
written every batch. Each driver run is the real ``Coordinator`` over the real
``CommitLog`` (on a ``ModelStore``) and a ``ModelSink``. Phase 1 is a model of Spark's
task scheduling: an attempt per partition, retries after a failure (up to
``max_failures``), speculative copies, stage retries that number attempts from 0
again, and attempts that run on after their job ended (zombies). Faults are choices
the exploration makes at every step:

========  =====================================================================
crash     the driver dies here (no cleanup); the supervisor restarts the query,
          possibly with another partition count
fail      a task attempt dies here (before begin, write or prepare, or after
          prepare); Spark retries it or fails the job
copy      a speculative copy of this partition starts now
stage     a fetch failure: the stage is retried, its attempts numbered from 0
recover   ``sparkeos recover --force`` starts now, beside the running driver
========  =====================================================================

Invariants checked in every reached state: no id visible twice; every ID holding
state is covered by a ``begun`` record (invariant 7); a commit only of attempts a
durable decision names (1); never a rollback of a decided attempt's prepared state
(10); no ``DataLossError``. At quiescence, after a last full recovery: every id of
every batch visible exactly once (2, 3), nothing open or prepared left (4, 5), and
the query finished within a bounded number of restarts (no stuck state).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import ConfigurationError, DataLossError, SparkEOSError
from sparkeos.core.protocol import CommitLocation
from sparkeos.core.snapshot.commitlog import BEGUN, CommitLog, record_name
from sparkeos.core.snapshot.coordinator import Coordinator, TaskAttempt, TaskFunction, TaskResult
from sparkeos.core.snapshot.group import SinkGroup
from sparkeos.core.streaming import adapter as adapter_mod

from .scheduler import Actor, Budget, Killed, Scheduler, TaskDied
from .system import ModelSink, ModelStore, ModelSystem, id_rows, parse_txn, parsed_record

QUERY_KEY = "mq"
SINK = "sink"
GOOD_SCHEMA = pa.schema([("id", pa.int64())])
BAD_SCHEMA = pa.schema([("id", pa.string())])


@dataclass(frozen=True)
class Scenario:
    """One shape of the query; the exploration runs every scenario of the bound."""

    name: str
    batches: int = 3
    partitions: int = 2
    commit_location: CommitLocation = CommitLocation.DRIVER
    max_failures: int = 2
    task_attempts: int = 4
    two_sinks_one_name: bool = False
    refused_first_schema: bool = False
    group: bool = False
    """Two sinks under one decision (a ``SinkGroup``): member ``b`` plans one partition
    fewer than ``a`` (at least one), both write every id."""
    overlap: bool = False
    """``overlap_commits``: each batch's phase 2 is an actor of its own (the driver's
    background thread), beside the next batch; a crash there kills the driver."""

    def ids(self, batch_id: int) -> list[int]:
        return [batch_id * 100 + i for i in range(3)]

    def expected(self) -> list[int]:
        return [i for b in range(self.batches) for i in self.ids(b)]


class Job:
    """Spark's view of one phase-1 job: attempts per partition, first success wins."""

    def __init__(self, world: World, task: TaskFunction, partitions: list[list[int]],
                 batch_id: int) -> None:
        self.world = world
        self.task = task
        self.data = partitions
        self.batch_id = batch_id
        self.results: dict[int, TaskResult] = {}
        self.failures: dict[int, int] = {}
        self.next_number: dict[int, int] = {}
        self.stage = 0
        self.error: BaseException | None = None
        self.done = False
        for p in range(len(partitions)):
            self.launch(p)

    def launch(self, partition: int, number: int | None = None) -> None:
        if number is None:
            number = self.next_number.get(partition, 0)
        self.next_number[partition] = number + 1
        stage = self.stage
        name = f"b{self.batch_id}.p{partition}.s{stage}.a{number}"
        self.world.sched.spawn(name, lambda: self._attempt(partition, number, stage), "task")

    def _attempt(self, partition: int, number: int, stage: int) -> None:
        world = self.world
        world.tasks[world.sched.current] = (self, partition)  # type: ignore[index]
        try:
            batches: Iterator[pa.RecordBatch] = iter([id_rows(self.data[partition])])
            result = self.task(TaskAttempt(partition, number), batches)
            world.sched.point(f"task returns p{partition} a{number}")
        except Killed:
            raise
        except BaseException as exc:
            self.failed(partition, stage, exc)
            return
        if not self.done and partition not in self.results:
            self.results[partition] = result
            if len(self.results) == len(self.data):
                self.done = True

    def failed(self, partition: int, stage: int, exc: BaseException) -> None:
        if self.done or partition in self.results or stage != self.stage:
            return  # a zombie's failure changes nothing
        self.failures[partition] = self.failures.get(partition, 0) + 1
        if self.failures[partition] >= self.world.scenario.max_failures:
            self.error, self.done = exc, True
        else:
            self.launch(partition)

    def retry_stage(self) -> None:
        """A fetch failure: a new stage attempt for the unfinished partitions, its
        attempts numbered from 0 again; the old attempts run on as zombies."""
        self.stage += 1
        for p in range(len(self.data)):
            if p not in self.results:
                self.failures[p] = 0
                self.launch(p, 0)


class ModelRunner:
    """The ``BatchRunner`` of one batch of one driver run."""

    def __init__(self, world: World, batch_id: int, partitions: int,
                 schema: pa.Schema) -> None:
        self.world = world
        self.batch_id = batch_id
        ids = world.scenario.ids(batch_id)
        self.data = [ids[p::partitions] for p in range(partitions)]
        self.schema = schema

    def partitions(self) -> int:
        return len(self.data)

    def arrow_schema(self) -> pa.Schema:
        return self.schema

    def run_tasks(self, task: TaskFunction) -> list[TaskResult]:
        job = Job(self.world, task, self.data, self.batch_id)
        self.world.sched.point(f"await phase 1 of batch {self.batch_id}", lambda: job.done)
        if job.error is not None:
            raise RuntimeError(f"Job aborted: {job.error!r}")
        return [job.results[p] for p in range(len(self.data))]

    def run_in_tasks(self, fn: Callable[[Any], Any], items: Any) -> list[Any]:
        return [fn(item) for item in items]

    def run_without_output(self) -> None:
        pass


@functools.lru_cache(maxsize=16)
def _config(task_attempts: int, overlap: bool) -> CoordinatorConfig:
    """Every driver run and recovery makes coordinators; a config is immutable."""
    return CoordinatorConfig(name=SINK, commit_parallelism=1, task_attempts=task_attempts,
                             overlap_commits=overlap)


@functools.lru_cache(maxsize=4096)
def _attempt(txn_id: str) -> tuple[str, int, int] | None:
    """The begun record that must cover the attempt ``txn_id`` names, and the
    attempt's partition and tag (None: not an attempt ID of the query)."""
    txn = parse_txn(QUERY_KEY, SINK, txn_id)
    if txn is None:
        return None
    return record_name(txn.batch_id, BEGUN, txn.run), txn.partition, txn.tag


class World:
    """Everything one schedule shares: the scheduler, the log, the destinations."""

    def __init__(self, sched: Scheduler, scenario: Scenario) -> None:
        self.sched = sched
        self.scenario = scenario
        self.store = ModelStore(sched)
        self.log = CommitLog(self.store)
        names = ("A", "B") if scenario.two_sinks_one_name or scenario.group else ("A",)
        self.systems = [ModelSystem(sched, self.store, name) for name in names]
        for system in self.systems:
            system.reject_schema = _reject_string_ids
            system.on_change = self._state_changed
        self.spark_committed: set[int] = set()
        self._committed: tuple[int, ...] = ()
        """``spark_committed`` as a state holds it."""
        self.tasks: dict[Actor, tuple[Job, int]] = {}
        self.violations: list[str] = []
        self.refused = False
        self.states: set[int] = set()
        self.dead: set[str] = set()
        """Driver runs that crashed: their background phase 2 dies with them."""
        self.owners: dict[Actor, str] = {}
        self._changed = True
        """A system or ``spark_committed`` changed since the last state was taken."""
        self._log_version = -1
        """The version of the log the last state was taken of."""
        self._covered: dict[str, tuple[tuple[int, tuple[str, ...]], str | None]] = {}
        """Per system, the last covered check: its inputs (the log's version, the IDs
        held) and its answer. Most steps change neither (measured: a fifth of the
        check's time went to recomputing it)."""
        sched.on_turn = self.on_turn
        sched.on_step = self.on_step

    # -- faults ----------------------------------------------------------------------------
    def on_turn(self, actor: Actor, label: str) -> None:
        sched = self.sched
        if actor.kind == "driver" and actor.name in self.dead:
            raise Killed(actor.name)  # its background phase 2 crashed the process
        if actor.kind == "phase2" and self.owners[actor] in self.dead:
            raise Killed(actor.name)  # the driver process died
        if sched.spent_total >= sched.budget.total:
            return  # no fault left to inject (most turns, once one was)
        if actor.kind == "driver":
            if sched.inject("recover", lambda: f"sparkeos recover --force before {label}"):
                sched.spawn(f"recover@{len(sched.actors)}", self.racing_recover, "recover")
            if sched.inject("crash", lambda: f"{actor.name} dies before {label}"):
                self.dead.add(actor.name)
                raise Killed(actor.name)
        elif actor.kind == "phase2":
            owner = self.owners[actor]
            if sched.inject("crash", lambda: f"{owner} dies in {actor.name} before {label}"):
                self.dead.add(owner)
                raise Killed(actor.name)
        elif actor.kind == "task":
            job, partition = self.tasks[actor]
            if not job.done and partition not in job.results:
                if sched.inject("copy", lambda: f"speculative copy of p{partition} starts"):
                    job.launch(partition)
                if sched.inject("stage", lambda: "fetch failure: the stage is retried"):
                    job.retry_stage()
            if sched.inject("fail", lambda: f"{actor.name} dies before {label}"):
                raise TaskDied(actor.name)

    def on_step(self) -> None:
        for system in self.systems:
            if len(set(system.visible)) != len(system.visible):
                dupes = sorted({i for i in system.visible if system.visible.count(i) > 1})
                self.violations.append(f"invariant 3: ids {dupes} visible twice in "
                                       f"{system.name}")
            if system.held:
                covered = self._covered_check(system)
                if covered:
                    self.violations.append(covered)
            if system.violations:
                self.violations.extend(system.violations)
                system.violations.clear()
        # A state is new only after a write to the log, a change of a system or a batch
        # Spark committed; most steps do none of these.
        store = self.store
        if self._changed or store.version != self._log_version:
            self._changed = False
            self._log_version = store.version
            self.states.add(hash((store.fingerprint(),
                                  tuple([s.fingerprint() for s in self.systems]),
                                  self._committed)))

    def _state_changed(self) -> None:
        self._changed = True

    def spark_commits(self, batch_id: int) -> None:
        self.spark_committed.add(batch_id)
        self._committed = tuple(sorted(self.spark_committed))
        self._state_changed()

    def _covered_check(self, system: ModelSystem) -> str | None:
        inputs = (self.store.version, tuple(system.held))
        last = self._covered.get(system.name)
        if last is not None and last[0] == inputs:
            return last[1]
        answer = self._uncovered_held(system)
        self._covered[system.name] = (inputs, answer)
        return answer

    def _uncovered_held(self, system: ModelSystem) -> str | None:
        # Each ID needs only its run's begun record, by the name the commit log gives it
        # (reading the whole log again took most of the check's time).
        files = self.store.files
        for txn_id in system.held:
            attempt = _attempt(txn_id)
            data = files.get(attempt[0]) if attempt else None
            begun = parsed_record(data) if data is not None else None
            if attempt is None or begun is None or not (
                    attempt[1] < int(begun["partitions"]) and attempt[2] < int(begun["tags"])):
                return f"invariant 7: {txn_id} holds state no begun record covers"
        return None

    # -- actors ----------------------------------------------------------------------------
    def coordinator(self, system: ModelSystem, overlap: bool = False) -> Coordinator:
        config = _config(self.scenario.task_attempts, overlap)
        if self.scenario.group:
            group = SinkGroup({s.name.lower(): ModelSink(s, self.scenario.commit_location)
                               for s in self.systems})
            return Coordinator(group, config, self.log, QUERY_KEY,
                               background=self.start_phase2)
        sink = ModelSink(system, self.scenario.commit_location)
        return Coordinator(sink, config, self.log, QUERY_KEY, background=self.start_phase2)

    def start_phase2(self, name: str, work: Callable[[], None]) -> _ActorRunning:
        """The coordinator's background thread: an actor of the driver that starts it."""
        owner = self.sched.current
        assert owner is not None
        actor = self.sched.spawn(name, work, "phase2")
        self.owners[actor] = owner.name
        return _ActorRunning(self.sched, actor)

    def coordinators(self, overlap: bool = False) -> list[Coordinator]:
        """One per adapter of the query: a group has one for all its members."""
        systems = self.systems[:1] if self.scenario.group else self.systems
        return [self.coordinator(system, overlap) for system in systems]

    def runners(self, batch_id: int, partitions: int, schema: pa.Schema) -> Any:
        if not self.scenario.group:
            return ModelRunner(self, batch_id, partitions, schema)
        return {"a": ModelRunner(self, batch_id, partitions, schema),
                "b": ModelRunner(self, batch_id, max(1, partitions - 1), schema)}

    def racing_recover(self) -> None:
        try:
            self.coordinator(self.systems[0]).recover(full=True)
        except (Killed, TaskDied):
            raise
        except DataLossError as exc:
            self.violations.append(f"DataLossError in recover: {exc.problem}")
        except SparkEOSError:
            pass

    def drive(self, run: int, partitions: int, result: dict[str, Any]) -> None:
        scenario = self.scenario
        coordinators = self.coordinators(scenario.overlap)
        try:
            for token in range(len(coordinators)):
                # Both adapters of the two-sinks scenario carry the same name.
                adapter_mod.claim_sink_name(f"run{run}", self.log.location, f"a{token}", SINK)
            for batch_id in range(scenario.batches):
                if batch_id in self.spark_committed:
                    continue
                schema = BAD_SCHEMA if scenario.refused_first_schema and run == 1 else (
                    GOOD_SCHEMA)
                self.sched.point(f"foreachBatch({batch_id})")
                for coord in coordinators:
                    coord.run_batch(batch_id, self.runners(batch_id, partitions, schema))
                self.sched.point(f"Spark commits batch {batch_id}")
                self.spark_commits(batch_id)
            result["outcome"] = "completed"
        except (Killed, TaskDied):
            result["outcome"] = "crashed"
            raise
        except DataLossError as exc:
            self.violations.append(f"DataLossError: {exc.problem}")
            result["outcome"] = "failed"
        except ConfigurationError as exc:
            result["outcome"] = "refused" if "share the commit log" in exc.problem else "failed"
        except SparkEOSError:
            result["outcome"] = "failed"
        except Exception as exc:  # a bug in the model or the code under test
            self.violations.append(f"unexpected {exc!r} in driver run {run}")
            result["outcome"] = "failed"

    def main(self) -> None:
        scenario = self.scenario
        max_runs = self.sched.budget.total + 4
        run = 0
        while len(self.spark_committed) < scenario.batches:
            run += 1
            if run > max_runs:
                self.violations.append(f"stuck: the query did not finish in {max_runs} runs")
                return
            partitions = scenario.partitions
            if run > 1:
                partitions = self.sched.pick(
                    [scenario.partitions, 1, scenario.partitions + 1],
                    "the restarted query plans partitions")
            result: dict[str, Any] = {}
            driver = self.sched.spawn(f"driver{run}",
                                      functools.partial(self.drive, run, partitions, result),
                                      "driver")
            self.sched.point(f"await driver{run}", functools.partial(_done, driver))
            if result.get("outcome") == "refused":
                self.refused = True
                return  # the user must give the sinks distinct names
        others = [a for a in self.sched.actors if a.name != "main"]
        self.sched.point("await quiescence", lambda: all(a.state == "done" for a in others))
        self.finish()

    def finish(self) -> None:
        """A last restart after every attempt ended: full recovery, then the checks."""
        for coord in self.coordinators():
            try:
                coord.recover(full=True)
            except SparkEOSError as exc:
                self.violations.append(f"final recovery failed: {exc.problem}")
        for system in self.systems:
            expected = sorted(self.scenario.expected())
            if sorted(system.visible) != expected:
                missing = sorted(set(expected) - set(system.visible))
                self.violations.append(f"invariant 2: {system.name} shows "
                                       f"{sorted(system.visible)}, missing {missing}")
            if system.held:
                self.violations.append(f"invariant 4: attempts left state behind in "
                                       f"{system.name}: {sorted(system.held)}")


def _done(actor: Actor) -> bool:
    return actor.state == "done"


class _ActorRunning:
    """A background phase 2 as the coordinator sees it (``core.snapshot.overlap.Running``)."""

    def __init__(self, sched: Scheduler, actor: Actor) -> None:
        self.sched = sched
        self.actor = actor

    def done(self) -> bool:
        return _done(self.actor)

    def wait(self) -> None:
        self.sched.point(f"await {self.actor.name}", self.done)

    def is_current(self) -> bool:
        return self.sched.current is self.actor


_BIGINT = pa.int64()  # made once: pa.int64() costs more than the comparison


def _reject_string_ids(schema: pa.Schema) -> str | None:
    return "id must be bigint" if schema.field("id").type != _BIGINT else None


def run_schedule(scenario: Scenario, prefix: list[int], budget: Budget) -> tuple[
        Scheduler, World]:
    sched = Scheduler(prefix, budget)
    world = World(sched, scenario)
    sched.run(world.main)
    for actor in sched.actors:
        if actor.error is not None and not isinstance(actor.error, TaskDied):
            world.violations.append(f"{actor.name} raised {actor.error!r}")
    if not world.refused:
        blocked = [a.name for a in sched.actors if a.state != "done"]
        if blocked:
            world.violations.append(f"stuck: {blocked} never finished")
    return sched, world
