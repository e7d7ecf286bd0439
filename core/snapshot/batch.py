"""The batch protocol: one micro-batch under exactly-once (begun, phase 1, the
decision, phase 2) and under at-least-once / none (each task commits its own).

``ExactlyOnceBatch`` is one batch's run, step by step; the steps it delegates live in
their own modules: the checks before writing and the pins of the decision
(``checks``), recovery, phase 2 and sweeps (``recovery``), the task functions
(``tasks``). Every fault-injection point of the protocol is reached here or there, at
the same step as always.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import (
    CommitLogError,
    ConfigurationError,
    RetriableError,
    SchemaMismatchError,
    SparkEOSError,
    TransactionAbortedError,
    cause_fix,
    describe_cause,
)
from sparkeos.core.observe import BatchMetrics, log_event

from . import committers
from .checks import PreDecisionChecks
from .commitlog import BEGUN, DECIDED, FINISHED, BatchState
from .group import SINGLE
from .recovery import Recovery
from .replay import note_replays
from .scope import Scope
from .tasks import BatchRunner, DirectTask, PrepareTask, TaskResult, spreads_commits

Layout = dict[str, tuple[int, int]]
"""Each member's (offset, count) among the group's participants."""


@dataclass(frozen=True)
class Opened:
    """A run that began: its state, number, plan and the members' schemas."""

    state: BatchState
    run: int
    layout: Layout
    schemas: Mapping[str, pa.Schema]


@dataclass
class ExactlyOnceBatch:
    """One run of one batch under exactly-once, in the order of the protocol."""

    scope: Scope
    checks: PreDecisionChecks
    recovery: Recovery
    batch_id: int
    runners: dict[str, BatchRunner]
    metrics: BatchMetrics
    check_participants: bool = True
    """Ask each sink whether it takes the plan's participant count (off where the count
    is only an upper bound set by the user: the format route's ``maxPartitions``)."""
    busy: frozenset[int] = frozenset()
    """Batches whose phase 2 runs in the background (``core.snapshot.overlap``): recovery
    leaves them to it."""
    held: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Per member, the participants of that background batch (still open)."""

    def run(self, defer_commit: bool = False) -> BatchState | None:
        """The batch, in order. With ``defer_commit``, stop at the decision and return
        the decided state: its phase 2 (``commit``) is the caller's."""
        opened = self.open()
        if opened is None:
            return None
        participants = self.prepare(opened)
        self.decide(opened.state, opened.run, participants, opened.schemas)
        if defer_commit:
            self.metrics.outcome = "decided"
            return opened.state
        self.commit(opened.state)
        return None

    def open(self) -> Opened | None:
        """Everything before phase 1: recovery, the checks, the plan and ``begun``.
        None when the batch needs no phase 1 (decided before, or without partitions)."""
        m = self.metrics
        t_recover = time.perf_counter()
        m.recovered = self.recovery.recover(self.runners, skip=self.busy)
        m.recover_ms = ms_since(t_recover)
        states = self.scope.load_states()
        state = states.get(self.batch_id)
        if state is not None and (state.finished is not None or state.decided is not None):
            self.replay()
            return None
        schemas = {member: self.runners[member].arrow_schema()
                   for member in self.scope.members}
        self.checks.before_writing(self.batch_id, schemas)
        layout = self.plan()
        if sum(count for _offset, count in layout.values()) == 0:
            self.finish_empty(states)
            return None
        state, run = self.begin(states, state, layout)
        return Opened(state, run, layout, schemas)

    def replay(self) -> None:
        """Invariant 3: the batch was decided before; its commits are done by recovery,
        so a re-run writes nothing new."""
        self.metrics.outcome = "replayed"
        log_event("batch.replay_skipped", **self.scope.fields(self.batch_id))
        # Every member's DataFrame derives from the batch's: running one runs the
        # whole upstream plan (its state stores included) once.
        next(iter(self.runners.values())).run_without_output()

    def plan(self) -> Layout:
        """The participants of every member, each sink asked whether it takes them."""
        layout = member_layout(self.scope.members, self.runners)
        for member, part in self.scope.members.items():
            if layout[member][1] and self.check_participants:
                part.check_participants(layout[member][1] + self.held.get(member, 0))
        self.metrics.partitions = sum(count for _offset, count in layout.values())
        return layout

    def finish_empty(self, states: dict[int, BatchState]) -> None:
        """A batch without partitions: finished at once, nothing to prepare."""
        state = states.setdefault(self.batch_id, BatchState(self.batch_id))
        state.finished = self.scope.require_log().claim(
            self.batch_id, FINISHED, {"participants": 0, "rows": 0})
        self.metrics.outcome = "committed"

    def begin(self, states: dict[int, BatchState], state: BatchState | None,
              layout: Layout) -> tuple[BatchState, int]:
        """Record ``begun``: from now on every transaction ID of the run is known."""
        batch_id, pool = self.batch_id, self.scope.pool
        pool.check_slot_free(batch_id, [s.batch_id for s in states.values() if s.unresolved])
        self.recovery.sweep_slot(batch_id, states)
        run = (state.last_attempt + 1) if state is not None else 0
        self.metrics.run = run
        begun: dict[str, Any] = {"partitions": sum(c for _o, c in layout.values()),
                                 "slot": pool.slot_of(batch_id),
                                 "tags": self.scope.config.task_attempts}
        if self.scope.grouped:
            begun["members"] = {member: list(place) for member, place in layout.items()}
        self.scope.require_log().append(batch_id, BEGUN, begun, run)
        state = states.setdefault(batch_id, BatchState(batch_id))
        state.begun[run] = begun
        self.scope.faults.driver("after_begun", batch_id)
        return state, run

    def prepare(self, opened: Opened) -> list[dict[str, Any]]:
        """Phase 1: every task attempt of every member writes and prepares its own
        transaction; any failure aborts the run."""
        scope, t0 = self.scope, time.perf_counter()
        try:
            results: list[TaskResult] = []
            for member, part in scope.members.items():
                offset, count = opened.layout[member]
                if count:
                    results += self.runners[member].run_tasks(PrepareTask(
                        part, scope.pool, self.batch_id, opened.run, count,
                        scope.config.task_attempts, scope.faults, offset, member))
        except Exception as exc:
            self.recovery.abort_run(opened.state, opened.run, exc)
            raise phase1_error(exc, scope.name, self.batch_id) from exc
        return self.accept(opened, results, t0)

    def accept(self, opened: Opened, results: list[TaskResult],
               started: float | None = None) -> list[dict[str, Any]]:
        """The end of phase 1: one result per partition, each member's
        ``before_decision``; a failure aborts the run."""
        m, scope = self.metrics, self.scope
        try:
            participants = check_results(scope.name, self.batch_id, opened.layout, results)
            m.partitions = len(participants)
            for member, part in scope.members.items():
                part.before_decision(self.batch_id, [p["receipt"] for p in participants
                                                     if p.get("member", SINGLE) == member])
        except Exception as exc:
            self.recovery.abort_run(opened.state, opened.run, exc)
            raise phase1_error(exc, scope.name, self.batch_id) from exc
        if started is not None:
            m.prepare_ms = ms_since(started)
        m.rows = sum(int(r["rows"]) for r in results)
        note_replays(scope.name, scope.pool.query_key, self.batch_id, participants, m)
        scope.faults.driver("after_all_prepared", self.batch_id)
        return participants

    def decide(self, state: BatchState, run: int, participants: list[dict[str, Any]],
               schemas: Mapping[str, pa.Schema]) -> None:
        """The decision: after this record, the batch must be committed."""
        t1 = time.perf_counter()
        members = self.scope.members
        committers.assign(
            participants, members, self.scope.config.commit_parallelism,
            lambda p: str(p.get("member", SINGLE)),
            lambda member: not spreads_commits(members[member], self.runners.get(member)))
        decided = {"outcome": DECIDED, "participants": participants,
                   "rows": self.metrics.rows, "slot": self.scope.pool.slot_of(self.batch_id)}
        if self.scope.settle(state, run, decided).get("outcome") != DECIDED:
            self.recovery.sweep([state], quiet=True)
            raise TransactionAbortedError(
                f"run {run} of the batch was recorded as aborted by another process "
                "(`sparkeos recover --force`, or a second driver on the same checkpoint) "
                "before this driver could decide it; nothing of it was committed",
                sink=self.scope.name, batch_id=self.batch_id,
                fix="run one driver per checkpointLocation and `sparkeos recover` only "
                "while the query is stopped; restart the query and the batch is written "
                "again",
            )
        self.metrics.decide_ms = ms_since(t1)
        self.checks.pin_on_decision(schemas)
        self.scope.faults.decided(self.batch_id)
        self.scope.faults.driver("after_decided", self.batch_id)

    def commit(self, state: BatchState, purge: bool = True) -> None:
        """Phase 2: every participant commits; a failure leaves the batch decided.
        ``purge``: then drop records past the retention window (not from a background
        thread: the caller purged before starting it)."""
        t2 = time.perf_counter()
        try:
            self.recovery.commit_decided(state, self.runners, recovering=False)
        except SparkEOSError:
            raise
        except Exception as exc:
            raise RetriableError(
                f"phase 2 (commit) failed: {describe_cause(exc)}; the batch is decided, so "
                "it will be committed, not lost",
                sink=self.scope.name, batch_id=self.batch_id,
                fix="restart the query (or run `sparkeos recover <checkpointLocation>`) "
                "once the destination is reachable; the commits are finished first",
            ) from exc
        self.metrics.commit_ms = ms_since(t2)
        self.metrics.outcome = "committed"
        if purge:
            self.scope.purge(self.batch_id)


def run_direct(scope: Scope, recovery: Recovery, direct_run: int, batch_id: int,
               runners: dict[str, BatchRunner], m: BatchMetrics) -> None:
    """At-least-once / none: validate, sweep what earlier runs left (once per
    coordinator), then every task commits its own transaction."""
    for member, part in scope.members.items():
        part.validate(runners[member].arrow_schema())
    layout = member_layout(scope.members, runners)
    if not recovery.direct_swept:
        recovery.sweep_direct(batch_id, sum(count for _offset, count in layout.values()))
    t0 = time.perf_counter()
    for member, (offset, count) in layout.items():
        m.partitions += count
        if count:
            results = runners[member].run_tasks(
                DirectTask(scope.members[member], scope.pool, batch_id, direct_run,
                           offset, scope.faults))
            m.rows += sum(int(r["rows"]) for r in results)
            note_replays(scope.name, scope.pool.query_key, batch_id, results, m)
    m.prepare_ms = ms_since(t0)
    m.outcome = "direct"


def member_layout(members: Mapping[str, Any], runners: Mapping[str, BatchRunner]) -> Layout:
    """Each member's (offset, count) among the group's participants."""
    layout: Layout = {}
    offset = 0
    for member in members:
        count = runners[member].partitions()
        layout[member] = (offset, count)
        offset += count
    return layout


def check_results(
    sink: str, batch_id: int, layout: Mapping[str, tuple[int, int]], results: list[TaskResult]
) -> list[dict[str, Any]]:
    """The participants, in partition order. A member planned for ``count``
    partitions may have run fewer (the plan is an upper bound), always the first
    ones: a gap, a duplicate or a partition outside the plan is a bug."""
    by_partition = {int(r["partition"]): r for r in results}
    expected: list[int] = []
    for offset, count in layout.values():
        ran = sum(1 for p in by_partition if offset <= p < offset + count)
        expected += range(offset, offset + ran)
    if sorted(by_partition) != expected or len(by_partition) != len(results):
        raise CommitLogError(
            f"phase 1 returned results for partitions {sorted(by_partition)} "
            f"({len(results)} results) but the plan {dict(layout)} calls for "
            f"{expected}",
            sink=sink, batch_id=batch_id,
            fix="this is a bug in the batch runner; please report it",
        )
    participants = []
    for p in expected:
        result = by_partition[p]
        entry = {"partition": p, "tag": int(result["tag"]), "attempt": result["attempt"],
                 "rows": result["rows"], "receipt": result["receipt"]}
        if "member" in result:
            entry["member"] = result["member"]
        participants.append(entry)
    return participants


def phase1_error(exc: Exception, sink: str, batch_id: int) -> SparkEOSError:
    """What a failed phase 1 raises (after the run was aborted): a task's
    configuration error as itself, anything else as ``TransactionAbortedError``."""
    config_error = task_configuration_error(exc, sink, batch_id)
    if config_error is not None:
        return config_error
    advice = cause_fix(exc)
    return TransactionAbortedError(
        f"phase 1 (prepare) failed: {describe_cause(exc, 1000)}; every transaction "
        "of the batch was rolled back",
        sink=sink, batch_id=batch_id,
        fix=(advice or "fix the cause above and restart the query") + "; Spark "
        "re-runs this batch and nothing is lost or duplicated",
    )


def task_configuration_error(exc: BaseException, sink: str,
                             batch_id: int) -> ConfigurationError | None:
    """A ``ConfigurationError`` a task raised reaches the driver as text inside Spark's
    own exception; re-raise it as what it is (after the run was aborted)."""
    if isinstance(exc, ConfigurationError):
        return exc
    # Anywhere in the task's traceback: an exception it was handling comes first.
    lines = [line.strip() for line in str(exc).splitlines()]
    for kind in (SchemaMismatchError, ConfigurationError):
        marker = f"{kind.__name__}: "
        cause = next((line for line in lines if marker in line), None)
        if cause is not None:
            problem = cause.split(marker, 1)[1].strip()
            return kind(f"{problem} (raised in a task; every transaction of the batch "
                        "was rolled back)", sink=sink, batch_id=batch_id,
                        fix="fix the configuration and restart the query; nothing of this "
                        "batch was committed")
    return None


def ms_since(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 3)
