"""What runs inside a Spark task: phase 1 of one task attempt (``PrepareTask``), a
direct commit under at-least-once (``DirectTask``) and phase 2 of one participant
(``CommitTask``), with the types a ``BatchRunner`` hands them.

These objects are pickled to the executors: they hold the sink, the transaction pool
and the fault plan, never the commit log or anything of the driver's process.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from sparkeos.core.errors import CommitLogError, ConfigurationError
from sparkeos.core.faults import FaultPlan, task_attempt_number
from sparkeos.core.protocol import CommitLocation, Receipt, TransactionalSink
from sparkeos.core.steps import COMMIT, commit_step

from .group import SINGLE
from .replay import REPLAY_KEY
from .txpool import Transaction, TransactionPool

TaskResult = dict[str, Any]


@dataclass(frozen=True)
class TaskAttempt:
    """One attempt of a task, as Spark numbers it.

    ``attempt_number`` is ``TaskContext.attemptNumber()``: 0 for the first attempt,
    then retries and speculative copies. A retried stage numbers its attempts from 0
    again (PySpark does not expose the stage attempt), so two attempts of different
    stage attempts may share a transaction ID: ``begin`` claims its ID exclusively,
    and the later one fails (Spark retries it under the next number). ``token`` is
    Spark's unique attempt ID, for logs.
    """

    partition: int
    attempt_number: int = 0
    token: str = ""


TaskFunction = Callable[[TaskAttempt, Iterator[pa.RecordBatch]], TaskResult]


class BatchRunner(Protocol):
    """How the coordinator reaches the data of one micro-batch."""

    def partitions(self) -> int:
        """An upper bound of the partitions ``run_tasks`` runs, known before it runs:
        they are numbered ``0 .. k-1`` with ``k`` at most this. Every transaction ID of
        the batch derives from it, so it goes on record before any task writes."""
        ...

    def arrow_schema(self) -> pa.Schema: ...

    def run_tasks(self, task: TaskFunction) -> list[TaskResult]:
        """Run ``task`` once per partition (retries allowed); return one result per
        partition, from the attempt Spark accepted."""
        ...

    def run_in_tasks(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """Run ``fn`` over ``items``, one item per task."""
        ...

    def run_without_output(self) -> None:
        """Compute the batch and drop the rows (a replayed batch that was committed
        before: a stateful query's state stores commit only when the whole plan ran)."""
        ...


def spreads_commits(sink: TransactionalSink[Any], runner: BatchRunner | None) -> bool:
    """Whether phase 2 of ``sink`` runs in Spark tasks spread over the executors
    (``TASKS`` and a runner of Spark's): merging participants there
    (``core.snapshot.committers``) would take the commits' parallelism away. A runner
    that runs its tasks in this process says so (``runs_in_this_process``)."""
    return (sink.commit_location is CommitLocation.TASKS and runner is not None
            and not getattr(runner, "runs_in_this_process", False))


def attempt_tag(attempt: TaskAttempt, task_attempts: int) -> int:
    """The attempt's place in the ID range ``begun`` recorded; refuses one outside it."""
    if not 0 <= attempt.attempt_number < task_attempts:
        raise ConfigurationError(
            f"task attempt {attempt.attempt_number} of partition {attempt.partition} is "
            f"outside the range recorded for this batch ({task_attempts} attempts); this "
            "attempt wrote nothing",
            fix="pass exactly_once(..., task_attempts=N) with N above spark.task.maxFailures "
            "plus speculative copies; the batch is re-run, nothing is lost",
        )
    return attempt.attempt_number


@dataclass(frozen=True)
class PrepareTask:
    """Phase 1 of one task attempt, shipped to a task. ``partitions`` is the member's
    count; its participants are the group's ``offset .. offset + partitions - 1``."""

    sink: TransactionalSink[Any]
    pool: TransactionPool
    batch_id: int
    run: int
    partitions: int
    task_attempts: int
    faults: FaultPlan
    offset: int = 0
    member: str = SINGLE

    def __call__(self, attempt: TaskAttempt, batches: Iterator[pa.RecordBatch]) -> TaskResult:
        if not 0 <= attempt.partition < self.partitions:
            raise CommitLogError(
                f"task for partition {attempt.partition} ran, but the batch was planned with "
                f"{self.partitions} partitions (its transaction ID is not on record)",
                sink=self.pool.sink,
                batch_id=self.batch_id,
                fix="keep the batch DataFrame's partitioning stable between planning and "
                "execution (e.g. disable AQE partition coalescing for this query)",
            )
        partition = self.offset + attempt.partition
        tag = attempt_tag(attempt, self.task_attempts)
        txn = self.pool.transaction(self.batch_id, partition, self.run, tag)
        self.faults.before_begin(self.batch_id, partition, attempt.attempt_number)
        started = time.perf_counter()
        written = _write_transaction(self.sink, txn, batches)
        self.faults.hold(self.batch_id, partition, attempt.attempt_number)
        for point in ("task_fail_before_prepare", "kill_executor_before_prepare"):
            self.faults.task(point, self.batch_id, partition, attempt.attempt_number)
        try:
            receipt = self.sink.prepare(written.handle)
        except Exception:
            with contextlib.suppress(Exception):
                self.sink.abort(written.handle, txn)
            raise
        self.faults.task("kill_driver_after_first_prepare", self.batch_id, partition,
                         attempt.attempt_number)
        self.faults.task("task_fail_after_prepare", self.batch_id, partition,
                         attempt.attempt_number)
        return {
            "partition": partition,
            **({"member": self.member} if self.member != SINGLE else {}),
            "tag": tag,
            "attempt": txn.attempt,
            "spark_attempt": attempt.token,
            "rows": written.count,
            "receipt": receipt,
            "prepare_ms": (time.perf_counter() - started) * 1000,
        }


@dataclass(frozen=True)
class DirectTask:
    """At-least-once / none: each task commits its own transaction right away."""

    sink: TransactionalSink[Any]
    pool: TransactionPool
    batch_id: int
    run: int
    """The query run's own number (``DIRECT_RUNS``): a replayed batch never reuses an ID
    an earlier run committed or a killed task of it left behind."""
    offset: int = 0
    faults: FaultPlan = field(default_factory=FaultPlan)

    def __call__(self, attempt: TaskAttempt, batches: Iterator[pa.RecordBatch]) -> TaskResult:
        partition = self.offset + attempt.partition
        txn = self.pool.transaction(self.batch_id, partition, self.run,
                                    attempt.attempt_number)
        started = time.perf_counter()
        written = _write_transaction(self.sink, txn, batches, lambda: self.faults.mid_write(
            self.batch_id, partition, attempt.attempt_number))
        receipt = self.sink.prepare(written.handle)
        self.faults.task("task_fail_after_prepare", self.batch_id, partition,
                         attempt.attempt_number)
        self.sink.commit(txn, receipt)
        self.faults.direct_committed(self.batch_id, partition)
        return {"partition": partition, "rows": written.count,
                "prepare_ms": (time.perf_counter() - started) * 1000,
                **({REPLAY_KEY: receipt[REPLAY_KEY]} if REPLAY_KEY in receipt else {})}


@dataclass(frozen=True)
class CommitTask:
    """Phase 2 of one commit unit (one participant, or the participants one committer
    makes visible together: ``core.snapshot.committers``): on the driver, or shipped to
    a task (TASKS)."""

    sink: TransactionalSink[Any]
    recovering: bool
    faults: FaultPlan = field(default_factory=FaultPlan)
    in_task: bool = False

    def __call__(self, unit: Sequence[tuple[Transaction, Receipt]]) -> int:
        txn, receipt = unit[0]
        commit_step(COMMIT, txn)
        if len(unit) > 1:
            if not self.sink.merges_commits():
                raise ConfigurationError(
                    f"batch {txn.batch_id} was decided with partitions "
                    f"{[t.partition for t, _r in unit]} committed together, and "
                    f"{type(self.sink).__name__} does not merge commits (a sink of another "
                    "kind or version under this name): they cannot be committed as decided",
                    sink=txn.sink, batch_id=txn.batch_id,
                    fix="finish the batch with the sink (and sparkeos version) that "
                    "decided it; `sparkeos status <checkpointLocation>` shows the batch")
            self.sink.commit_merged(list(unit), recovering=self.recovering)
        elif self.recovering:
            self.sink.recover_commit(txn, receipt)
        else:
            self.sink.commit(txn, receipt)
        if self.in_task:
            # The driver-side point, reached from the task that committed first.
            self.faults.task("after_first_commit", txn.batch_id, txn.partition, 0)
            self.faults.task("kill_executor_after_commit", txn.batch_id, txn.partition,
                             task_attempt_number())
        return txn.partition


@dataclass
class _Written:
    handle: Any
    count: int


def _write_transaction(
    sink: TransactionalSink[Any], txn: Transaction, batches: Iterator[pa.RecordBatch],
    after_first_write: Callable[[], None] | None = None,
) -> _Written:
    handle = sink.begin(txn)
    count = 0
    try:
        for batch in batches:
            if batch.num_rows:
                sink.write(handle, batch)
                if count == 0 and after_first_write is not None:
                    after_first_write()
                count += batch.num_rows
    except Exception:
        # The write error is what the user must see; a failing abort is secondary
        # (the coordinator's sweep of this ID cleans up).
        with contextlib.suppress(Exception):
            sink.abort(handle, txn)
        raise
    return _Written(handle, count)


Runners = BatchRunner | Mapping[str, BatchRunner]
"""One runner, or one per member of a ``SinkGroup`` (each member's own DataFrame)."""
