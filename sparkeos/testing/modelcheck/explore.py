"""Exploring every schedule of every scenario within a bound, and reporting."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sparkeos.core.protocol import CommitLocation
from sparkeos.core.streaming import adapter as adapter_mod

from .mutants import MUTANTS
from .scenario import Scenario, run_schedule
from .scheduler import Budget, next_prefix

FAULTS = ("crash", "fail", "copy", "stage", "recover", "choice")


@dataclass(frozen=True)
class Bound:
    name: str
    runs: tuple[tuple[Scenario, Budget], ...]
    """Each scenario with the budget its schedules are explored within."""

    @property
    def scenarios(self) -> tuple[Scenario, ...]:
        return tuple(scenario for scenario, _ in self.runs)


def _budget(total: int, delays: int, **kinds: int) -> Budget:
    return Budget(delays=delays, total=total, kinds={k: kinds.get(k, total) for k in FAULTS})


ONE_FAULT = _budget(total=1, delays=1)
"""Every single fault (of every kind) at every step, plus one scheduling delay: any
actor may be run out of turn once, anywhere."""
TWO_FAULTS = _budget(total=2, delays=0, stage=1, recover=1)
"""Every pair of faults at every pair of steps."""

# Two batches with every pair of faults, without and with overlapping commits: in both
# bounds, so that the test suite sees a crash meet a second fault (a racing recover, a
# stage retry, a task's death) anywhere.
QUERY_TWO_FAULTS = (Scenario("query-two-faults", batches=2), TWO_FAULTS)
OVERLAP_TWO_FAULTS = (Scenario("query-overlap-two-faults", batches=2, overlap=True),
                      TWO_FAULTS)

SMALL = Bound("small", (
    (Scenario("two-sinks-one-name", batches=1, two_sinks_one_name=True), ONE_FAULT),
    (Scenario("refused-first-schema", batches=1, refused_first_schema=True), ONE_FAULT),
    (Scenario("query", batches=2, max_failures=1), _budget(total=1, delays=1, stage=0)),
    (Scenario("sink-group", batches=1, group=True), ONE_FAULT),
    # The overlap's own faults (a crash anywhere, in its thread too; recover racing it);
    # task faults beside it run in the full bound.
    (Scenario("query-overlap", batches=2, partitions=1, max_failures=1, overlap=True),
     _budget(total=1, delays=1, stage=0, copy=0, fail=0, choice=0)),
    QUERY_TWO_FAULTS,
    OVERLAP_TWO_FAULTS,
))
"""Runs in the normal test suite (about 24,600 schedules, a minute)."""

FULL = Bound("full", (
    (Scenario("two-sinks-one-name", batches=2, two_sinks_one_name=True), ONE_FAULT),
    (Scenario("refused-first-schema", batches=2, refused_first_schema=True), ONE_FAULT),
    (Scenario("query"), ONE_FAULT),
    (Scenario("query-no-task-retries", max_failures=1), ONE_FAULT),
    (Scenario("query-commit-in-tasks", commit_location=CommitLocation.TASKS), ONE_FAULT),
    QUERY_TWO_FAULTS,
    (Scenario("sink-group", batches=2, group=True), ONE_FAULT),
    (Scenario("sink-group-commit-in-tasks", batches=2, group=True,
              commit_location=CommitLocation.TASKS), ONE_FAULT),
    (Scenario("query-overlap", overlap=True), ONE_FAULT),
    OVERLAP_TWO_FAULTS,
))
"""``./run modelcheck`` (about 66,600 schedules, 3 minutes): 3 batches x 2 partitions with one
fault and one delay, in three shapes of the query; 2 batches with every pair of
faults; the same with ``overlap_commits`` (each batch's phase 2 beside the next
batch, a crash inside it too)."""

BOUNDS = {b.name: b for b in (SMALL, FULL)}


@dataclass
class Failure:
    scenario: str
    violations: list[str]
    trace: list[str]


@dataclass
class Report:
    bound: str
    mutant: str | None = None
    schedules: int = 0
    steps: int = 0
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)
    states: set[int] = field(default_factory=set)
    by_scenario: dict[str, int] = field(default_factory=dict)

    @property
    def violations(self) -> int:
        return len(self.failures)

    @property
    def shortest(self) -> Failure | None:
        return min(self.failures, key=lambda f: len(f.trace), default=None)

    def summary(self) -> str:
        return (f"model check: schedules={self.schedules} states={len(self.states)} "
                f"violations={self.violations}")


def explore(bound: Bound, mutant: str | None = None, stop_on_first: bool = False,
            progress: Callable[[Report], None] | None = None) -> Report:
    report = Report(bound.name, mutant)
    started = time.monotonic()
    patch = MUTANTS[mutant] if mutant else contextlib.nullcontext
    with patch(), _fresh_name_claims():
        for scenario, budget in bound.runs:
            prefix: list[int] | None = []
            while prefix is not None:
                sched, world = run_schedule(scenario, prefix, budget)
                report.schedules += 1
                report.by_scenario[scenario.name] = report.by_scenario.get(scenario.name, 0) + 1
                report.steps += len(sched.trace)
                report.states |= world.states
                if world.violations:
                    report.failures.append(Failure(scenario.name, world.violations,
                                                   sched.trace))
                    if stop_on_first:
                        break
                if progress is not None and report.schedules % 1000 == 0:
                    report.seconds = time.monotonic() - started
                    progress(report)
                prefix = next_prefix(sched.choices)
            if stop_on_first and report.failures:
                break
    report.seconds = time.monotonic() - started
    return report


@contextlib.contextmanager
def _fresh_name_claims() -> Iterator[None]:
    """The model's driver runs claim sink names like real query runs do; keep those
    claims out of the process-wide table afterwards."""
    saved = dict(adapter_mod._NAME_CLAIMS)
    try:
        yield
    finally:
        adapter_mod._NAME_CLAIMS.clear()
        adapter_mod._NAME_CLAIMS.update(saved)
