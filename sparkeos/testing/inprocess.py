"""In-process stand-ins for Spark and the checkpoint store, for fast protocol tests."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import pyarrow as pa

from sparkeos.core.errors import RecordExistsError
from sparkeos.core.faults import FaultPlan, InjectedCrash, InjectedTaskFailure
from sparkeos.core.snapshot.commitlog import Store
from sparkeos.core.snapshot.coordinator import TaskAttempt, TaskFunction, TaskResult


class BatchRunnerTarget(Protocol):
    def run_batch(self, batch_id: int, runner: Any) -> Any: ...


ID_SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])
_RUNS = itertools.count()


def id_batch(ids: Sequence[int]) -> pa.RecordBatch:
    """Rows shaped like the job's input: ``id`` and ``payload``."""
    return pa.RecordBatch.from_pydict(
        {"id": pa.array(list(ids), pa.int64()),
         "payload": pa.array([f"row-{i}" for i in ids], pa.string())},
        schema=ID_SCHEMA,
    )


class ArrowRunner:
    """In-process batch runner over one Arrow batch per partition; retries like Spark.

    ``before_attempt(partition, attempt)`` runs before each task attempt (to inject
    trouble such as a server restart); ``after_attempt(partition, attempt)`` after an
    attempt succeeded, before the next task starts (to start a concurrent attempt).
    ``first_attempt``: partition -> the attempt number its first attempt gets (as if
    earlier attempts, e.g. the original of a speculative copy, were still running)."""

    def __init__(self, partitions: Sequence[pa.RecordBatch], max_attempts: int = 2,
                 schema: pa.Schema | None = None,
                 before_attempt: Callable[[int, int], None] | None = None,
                 after_attempt: Callable[[int, int], None] | None = None,
                 first_attempt: dict[int, int] | None = None) -> None:
        self.run = next(_RUNS)  # like Spark's application ID: unique per driver run
        self.data = list(partitions)
        self.max_attempts = max_attempts
        self.schema = schema if schema is not None else (
            self.data[0].schema if self.data else ID_SCHEMA)
        self.before_attempt = before_attempt
        self.after_attempt = after_attempt
        self.first_attempt = dict(first_attempt or {})
        self.ran_without_output = False

    def partitions(self) -> int:
        return len(self.data)

    def arrow_schema(self) -> pa.Schema:
        return self.schema

    def run_tasks(self, task: TaskFunction) -> list[TaskResult]:
        results = []
        for p, batch in enumerate(self.data):
            first = self.first_attempt.get(p, 0)
            for attempt in range(first, first + self.max_attempts):
                batches: Iterator[pa.RecordBatch] = iter([batch] if batch.num_rows else [])
                try:
                    if self.before_attempt is not None:
                        self.before_attempt(p, attempt)  # may fail the attempt
                    results.append(task(TaskAttempt(p, attempt, f"r{self.run}-a{attempt}"),
                                        batches))
                except InjectedTaskFailure:
                    if attempt + 1 == first + self.max_attempts:
                        raise
                    continue
                if self.after_attempt is not None:
                    self.after_attempt(p, attempt)
                break
        return results

    def run_in_tasks(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        return [fn(item) for item in items]

    def run_without_output(self) -> None:
        self.ran_without_output = True


class ListRunner(ArrowRunner):
    """An ``ArrowRunner`` over partitions given as lists of ids (``id_batch`` rows)."""

    def __init__(self, partitions: list[list[int]], max_attempts: int = 2) -> None:
        super().__init__([id_batch(ids) for ids in partitions], max_attempts, ID_SCHEMA)


class OneProcessRunner(ListRunner):
    """A ``ListRunner`` that says its tasks run in this process, as the format route's
    phase 2 does (``core.snapshot.tasks.spreads_commits``): a sink that merges commits
    merges them. (The other runners stand in for Spark, whose tasks spread them.)"""

    runs_in_this_process = True


def run_uncommitted(coordinator: BatchRunnerTarget, plan: Sequence[list[Any]],
                    spark_committed: list[int],
                    runner: Callable[[list[Any]], ArrowRunner] = ListRunner) -> None:
    """Run the batches of ``plan`` Spark has not committed yet, as a (re)started query
    does; ``spark_committed`` plays Spark's own commit log and grows as batches end."""
    for batch_id, partitions in enumerate(plan):
        if batch_id in spark_committed:
            continue
        coordinator.run_batch(batch_id, runner(partitions))
        spark_committed.append(batch_id)


def crash_then_finish(coordinator_for: Callable[[FaultPlan | None], BatchRunnerTarget],
                      plan: Sequence[list[Any]], point: str,
                      runner: Callable[[list[Any]], ArrowRunner] = ListRunner,
                      batch_id: int = 1) -> None:
    """Run ``plan`` as a query that crashes (simulated) at ``point`` of batch
    ``batch_id``, then as its restart, to the end; ``coordinator_for(faults)``: a
    coordinator of the query's sink and commit log."""
    spark_committed: list[int] = []
    try:
        run_uncommitted(coordinator_for(FaultPlan(point, batch_id, simulate=True)), plan,
                        spark_committed, runner)
    except InjectedCrash:
        pass
    run_uncommitted(coordinator_for(None), plan, spark_committed, runner)


class MemoryStore(Store):
    """A commit-log store in a dict (no durability: for simulated crashes only)."""

    def __init__(self) -> None:
        self.location = "memory://"
        self.files: dict[str, bytes] = {}

    def list_names(self) -> list[str]:
        return list(self.files)

    def read(self, name: str) -> bytes:
        return self.files[name]

    def write_new(self, name: str, data: bytes) -> None:
        if name in self.files:
            raise RecordExistsError(f"{name} exists in {self.location}")
        self.files[name] = data

    def replace(self, name: str, data: bytes) -> None:
        self.files[name] = data

    def delete(self, name: str) -> None:
        self.files.pop(name, None)
