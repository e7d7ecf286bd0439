"""The two-phase snapshot coordinator (Jet's snapshotCommitPrepare / Finish on Spark).

The coordinator drives one sink through one micro-batch at a time. It knows nothing
about Spark: a ``BatchRunner`` runs the per-partition task function somewhere (Spark
tasks in production, a loop in unit tests) and returns one result per partition.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, final

import pyarrow as pa

from .commitlog import ABORTED, BEGUN, DECIDED, FINISHED, BatchState, CommitLog
from .config import CoordinatorConfig, Guarantee
from .errors import (
    CommitLogError,
    ConfigurationError,
    RetriableError,
    SchemaMismatchError,
    SparkEOSError,
    TransactionAbortedError,
    describe_cause,
)
from .faults import FaultPlan
from .observe import BatchMetrics, log_event
from .protocol import CommitLocation, Receipt, Transaction, TransactionalSink
from .txpool import TransactionPool

TaskResult = dict[str, Any]
TaskFunction = Callable[[int, int, str, Iterator[pa.RecordBatch]], TaskResult]
"""(partition, attempt_number, attempt_token, batches) -> result."""


class BatchRunner(Protocol):
    """How the coordinator reaches the data of one micro-batch."""

    def partitions(self) -> int: ...

    def arrow_schema(self) -> pa.Schema: ...

    def run_tasks(self, task: TaskFunction) -> list[TaskResult]:
        """Run ``task`` once per partition (retries allowed); return every result."""
        ...

    def run_in_tasks(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """Run ``fn`` over ``items``, one item per task."""
        ...


@dataclass(frozen=True)
class PrepareTask:
    """Phase 1 of one partition, shipped to a task."""

    sink: TransactionalSink[Any]
    pool: TransactionPool
    batch_id: int
    partitions: int
    faults: FaultPlan

    def __call__(
        self, partition: int, attempt_number: int, attempt: str, batches: Iterator[pa.RecordBatch]
    ) -> TaskResult:
        if not 0 <= partition < self.partitions:
            raise CommitLogError(
                f"task for partition {partition} ran, but the batch was planned with "
                f"{self.partitions} partitions (its transaction ID is not on record)",
                sink=self.pool.sink,
                batch_id=self.batch_id,
                fix="keep the batch DataFrame's partitioning stable between planning and "
                "execution (e.g. disable AQE partition coalescing for this query)",
            )
        txn = self.pool.transaction(self.batch_id, partition, attempt)
        started = time.perf_counter()
        rows = _write_transaction(self.sink, txn, batches)
        self.faults.task("task_fail_before_prepare", self.batch_id, partition, attempt_number)
        receipt = self.sink.prepare(rows.handle)
        self.faults.task("kill_driver_after_first_prepare", self.batch_id, partition,
                         attempt_number)
        self.faults.task("task_fail_after_prepare", self.batch_id, partition, attempt_number)
        return {
            "partition": partition,
            "attempt": attempt,
            "rows": rows.count,
            "receipt": receipt,
            "prepare_ms": (time.perf_counter() - started) * 1000,
        }


@dataclass(frozen=True)
class DirectTask:
    """At-least-once / none: each task commits its own transaction right away."""

    sink: TransactionalSink[Any]
    pool: TransactionPool
    batch_id: int

    def __call__(
        self, partition: int, attempt_number: int, attempt: str, batches: Iterator[pa.RecordBatch]
    ) -> TaskResult:
        txn = self.pool.transaction(self.batch_id, partition, attempt)
        started = time.perf_counter()
        written = _write_transaction(self.sink, txn, batches)
        receipt = self.sink.prepare(written.handle)
        self.sink.commit(txn, receipt)
        return {"partition": partition, "rows": written.count,
                "prepare_ms": (time.perf_counter() - started) * 1000}


@dataclass(frozen=True)
class CommitTask:
    """Phase 2 of one participant: on the driver, or shipped to a task (TASKS)."""

    sink: TransactionalSink[Any]
    recovering: bool
    faults: FaultPlan = field(default_factory=FaultPlan)
    in_task: bool = False

    def __call__(self, item: tuple[Transaction, Receipt]) -> int:
        txn, receipt = item
        if self.recovering:
            self.sink.recover_commit(txn, receipt)
        else:
            self.sink.commit(txn, receipt)
        if self.in_task:
            # The driver-side point, reached from the task that committed first.
            self.faults.task("after_first_commit", txn.batch_id, txn.partition, 0)
        return txn.partition


@dataclass
class _Written:
    handle: Any
    count: int


def _write_transaction(
    sink: TransactionalSink[Any], txn: Transaction, batches: Iterator[pa.RecordBatch]
) -> _Written:
    handle = sink.begin(txn)
    count = 0
    try:
        for batch in batches:
            if batch.num_rows:
                sink.write(handle, batch)
                count += batch.num_rows
    except Exception:
        # The write error is what the user must see; a failing abort is secondary
        # (the next rollback of this ID cleans up).
        with contextlib.suppress(Exception):
            sink.abort(handle, txn)
        raise
    return _Written(handle, count)


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 3)


@final
class Coordinator:
    """Runs batches of one sink under one guarantee; entry points are final."""

    def __init__(
        self,
        sink: TransactionalSink[Any],
        config: CoordinatorConfig,
        log: CommitLog | None,
        query_key: str,
        faults: FaultPlan | None = None,
    ) -> None:
        if config.guarantee not in sink.guarantees:
            offered = ", ".join(sorted(g.value for g in sink.guarantees))
            raise ConfigurationError(
                f"{type(sink).__name__} cannot give the {config.guarantee.value} guarantee "
                f"(it offers: {offered})",
                sink=config.name,
                fix="ask for a guarantee the sink supports, or use another sink",
            )
        if config.guarantee is Guarantee.EXACTLY_ONCE and log is None:
            raise ConfigurationError(
                "exactly-once needs a commit log", sink=config.name,
                fix="give the query a checkpointLocation",
            )
        self.sink = sink
        self.config = config
        self.log = log
        self.pool = TransactionPool(query_key, config.name)
        self.faults = faults or FaultPlan()
        self._states: dict[int, BatchState] | None = None
        self._meta: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.config.name

    # -- public entry points ----------------------------------------------------------
    def run_batch(self, batch_id: int, runner: BatchRunner) -> BatchMetrics:
        metrics = BatchMetrics(self.pool.query_key, self.name, batch_id,
                               self.config.guarantee.value)
        started = time.perf_counter()
        try:
            if self.config.guarantee is Guarantee.EXACTLY_ONCE:
                self._run_exactly_once(batch_id, runner, metrics)
            else:
                self._run_direct(batch_id, runner, metrics)
        except BaseException as exc:
            self._states = None  # re-read the log before anything else
            if isinstance(exc, SparkEOSError):
                self._remember_error(batch_id, exc)
            raise
        metrics.total_ms = _ms(started)
        log_event("batch.done", **self._fields(batch_id), outcome=metrics.outcome,
                  rows=metrics.rows, partitions=metrics.partitions,
                  prepare_ms=metrics.prepare_ms, decide_ms=metrics.decide_ms,
                  commit_ms=metrics.commit_ms, total_ms=metrics.total_ms)
        return metrics

    def recover(self, runner: BatchRunner | None = None) -> list[dict[str, Any]]:
        """Finish decided batches, roll back begun-but-undecided ones. Idempotent."""
        log = self._require_log()
        states = self._load_states()
        done: list[dict[str, Any]] = []
        for state in sorted(states.values(), key=lambda s: s.batch_id):
            if state.needs_commit:
                self._commit_decided(state, runner, recovering=True)
                done.append({"batch_id": state.batch_id, "action": "committed"})
            elif state.needs_rollback:
                attempt = state.last_attempt
                partitions = int(state.begun[attempt]["partitions"])
                self._rollback_all(state.batch_id, partitions, recovering=True)
                log.append(state.batch_id, ABORTED, {"reason": "recovery"}, attempt)
                state.aborted.add(attempt)
                log_event("recovery.rolled_back", **self._fields(state.batch_id),
                          attempt=attempt, partitions=partitions)
                done.append({"batch_id": state.batch_id, "action": "rolled_back"})
        return done

    def states(self) -> dict[int, BatchState]:
        return dict(self._load_states())

    # -- exactly-once ----------------------------------------------------------------------
    def _run_exactly_once(self, batch_id: int, runner: BatchRunner, m: BatchMetrics) -> None:
        log = self._require_log()
        m.recovered = self.recover(runner)
        states = self._load_states()
        state = states.get(batch_id)
        if state is not None and (state.finished is not None or state.decided is not None):
            # Invariant 3: the batch was decided before; its commits are done by
            # recover() above, so a re-run writes nothing new.
            m.outcome = "replayed"
            log_event("batch.replay_skipped", **self._fields(batch_id))
            return

        schema = runner.arrow_schema()
        self._check_schema(batch_id, schema)
        self.sink.validate(schema)
        partitions = runner.partitions()
        m.partitions = partitions
        if partitions == 0:
            log.append(batch_id, FINISHED, {"participants": 0, "rows": 0})
            states[batch_id] = BatchState(batch_id, finished={"participants": 0})
            m.outcome = "committed"
            return

        self.pool.check_slot_free(batch_id, [s.batch_id for s in states.values() if s.unresolved])
        attempt = (state.last_attempt + 1) if state is not None else 0
        txn_ids = [t.txn_id for t in self.pool.transactions(batch_id, partitions)]
        begun = {"partitions": partitions, "slot": self.pool.slot_of(batch_id), "txn_ids": txn_ids}
        log.append(batch_id, BEGUN, begun, attempt)
        state = states.setdefault(batch_id, BatchState(batch_id))
        state.begun[attempt] = begun
        self.faults.driver("after_begun", batch_id)

        # Phase 1: every task writes and prepares its own transaction.
        t0 = time.perf_counter()
        task = PrepareTask(self.sink, self.pool, batch_id, partitions, self.faults)
        try:
            results = runner.run_tasks(task)
            receipts = self._check_results(batch_id, partitions, results)
        except Exception as exc:
            self._abort_batch(state, attempt, partitions, exc)
            raise TransactionAbortedError(
                f"phase 1 (prepare) failed: {describe_cause(exc)}; every transaction of "
                "the batch was rolled back",
                sink=self.name, batch_id=batch_id,
                fix="fix the cause above and restart the query; Spark re-runs this batch "
                "and nothing is lost or duplicated",
            ) from exc
        m.prepare_ms = _ms(t0)
        m.rows = sum(int(r["rows"]) for r in results)
        self.faults.driver("after_all_prepared", batch_id)

        # The decision: after this record, the batch must be committed.
        t1 = time.perf_counter()
        decided = {"participants": receipts, "rows": m.rows, "slot": self.pool.slot_of(batch_id)}
        log.append(batch_id, DECIDED, decided)
        state.decided = decided
        m.decide_ms = _ms(t1)
        self.faults.driver("after_decided", batch_id)

        # Phase 2.
        t2 = time.perf_counter()
        try:
            self._commit_decided(state, runner, recovering=False)
        except SparkEOSError:
            raise
        except Exception as exc:
            raise RetriableError(
                f"phase 2 (commit) failed: {describe_cause(exc)}; the batch is decided, so "
                "it will be committed, not lost",
                sink=self.name, batch_id=batch_id,
                fix="restart the query (or run `sparkeos recover <checkpointLocation>`) "
                "once the destination is reachable; the commits are finished first",
            ) from exc
        m.commit_ms = _ms(t2)
        m.outcome = "committed"
        self._purge(batch_id)

    def _check_results(
        self, batch_id: int, partitions: int, results: list[TaskResult]
    ) -> list[dict[str, Any]]:
        by_partition = {int(r["partition"]): r for r in results}
        missing = sorted(set(range(partitions)) - set(by_partition))
        if missing or len(by_partition) != len(results):
            raise CommitLogError(
                f"phase 1 returned results for partitions {sorted(by_partition)} but the "
                f"batch has {partitions} (missing {missing})",
                sink=self.name, batch_id=batch_id,
                fix="this is a bug in the batch runner; please report it",
            )
        return [
            {"partition": p, "attempt": by_partition[p]["attempt"],
             "rows": by_partition[p]["rows"], "receipt": by_partition[p]["receipt"]}
            for p in range(partitions)
        ]

    def _commit_decided(
        self, state: BatchState, runner: BatchRunner | None, *, recovering: bool
    ) -> None:
        log = self._require_log()
        assert state.decided is not None
        items = [
            (self.pool.transaction(state.batch_id, int(p["partition"]), str(p["attempt"])),
             p["receipt"])
            for p in state.decided["participants"]
        ]
        in_tasks = self.sink.commit_location is CommitLocation.TASKS and bool(items)
        commit = CommitTask(self.sink, recovering, self.faults, in_tasks)
        if in_tasks:
            if runner is None:
                raise ConfigurationError(
                    f"{type(self.sink).__name__} commits in Spark tasks; recovery needs a "
                    "running Spark job",
                    sink=self.name, batch_id=state.batch_id,
                    fix="restart the query: it finishes the commits on its first batch",
                )
            runner.run_in_tasks(commit, items)
            self.faults.driver("after_all_commits", state.batch_id)
        else:
            self._commit_on_driver(commit, items, state.batch_id)
        finished = {"participants": len(items), "rows": state.decided.get("rows", 0),
                    "recovered": recovering}
        log.append(state.batch_id, FINISHED, finished)
        state.finished = finished
        if recovering:
            log_event("recovery.committed", **self._fields(state.batch_id),
                      participants=len(items))
        self.faults.driver("after_finished", state.batch_id)

    def _commit_on_driver(
        self, commit: CommitTask, items: list[tuple[Transaction, Receipt]], batch_id: int
    ) -> None:
        if not items:
            return
        first, rest = items[0], items[1:]
        commit(first)
        self.faults.driver("after_first_commit", batch_id)
        if rest:
            workers = min(self.config.commit_parallelism, len(rest))
            if workers == 1:
                for item in rest:
                    commit(item)
            else:
                with ThreadPoolExecutor(workers, thread_name_prefix="sparkeos-commit") as ex:
                    list(ex.map(commit, rest))
        self.faults.driver("after_all_commits", batch_id)

    def _rollback_all(self, batch_id: int, partitions: int, *, recovering: bool) -> None:
        for txn in self.pool.transactions(batch_id, partitions):
            if recovering:
                self.sink.recover_rollback(txn)
            else:
                self.sink.rollback(txn)

    def _abort_batch(
        self, state: BatchState, attempt: int, partitions: int, cause: BaseException
    ) -> None:
        log = self._require_log()
        log_event("batch.aborting", **self._fields(state.batch_id), attempt=attempt,
                  cause=describe_cause(cause))
        # If the rollback itself fails, the begun record stays unresolved and the next
        # run (or `sparkeos recover`) rolls back again: nothing is decided, so no loss.
        self._rollback_all(state.batch_id, partitions, recovering=False)
        log.append(state.batch_id, ABORTED, {"reason": describe_cause(cause)}, attempt)
        state.aborted.add(attempt)

    # -- at-least-once / none ---------------------------------------------------------------
    def _run_direct(self, batch_id: int, runner: BatchRunner, m: BatchMetrics) -> None:
        self.sink.validate(runner.arrow_schema())
        m.partitions = runner.partitions()
        t0 = time.perf_counter()
        results = runner.run_tasks(DirectTask(self.sink, self.pool, batch_id))
        m.prepare_ms = _ms(t0)
        m.rows = sum(int(r["rows"]) for r in results)
        m.outcome = "direct"

    # -- helpers -----------------------------------------------------------------------------
    def _require_log(self) -> CommitLog:
        if self.log is None:
            raise ConfigurationError("this coordinator has no commit log", sink=self.name)
        return self.log

    def _load_states(self) -> dict[int, BatchState]:
        if self._states is None:
            self._states = self._require_log().batches()
        return self._states

    def _check_schema(self, batch_id: int, schema: pa.Schema) -> None:
        log = self._require_log()
        if self._meta is None:
            self._meta = log.read_meta() or {}
        meta = self._meta
        recorded = meta.get("schema")
        current = [[f.name, str(f.type)] for f in schema]
        if recorded is None:
            meta["schema"] = current
            log.write_meta(meta)
            return
        if recorded == current or self.sink.accepts_schema_change:
            return
        before = {name: typ for name, typ in recorded}
        after = {name: typ for name, typ in current}
        changes = [f"+{n}:{t}" for n, t in after.items() if n not in before]
        changes += [f"-{n}:{t}" for n, t in before.items() if n not in after]
        changes += [f"{n}:{before[n]}->{t}" for n, t in after.items()
                    if n in before and before[n] != t]
        raise SchemaMismatchError(
            "the batch's schema differs from the schema this sink was started with: "
            + (", ".join(changes) or "column order changed"),
            sink=self.name, batch_id=batch_id,
            fix="select/cast the DataFrame back to the recorded schema, or write the new "
            "schema under a new sink name; nothing of this batch was written",
        )

    def _purge(self, batch_id: int) -> None:
        keep_from = batch_id - self.config.retain_batches
        states = self._load_states()
        old = [s for b, s in states.items() if b < keep_from]
        if old:
            self._require_log().purge_before(keep_from, old)
            for s in old:
                if not s.unresolved:
                    states.pop(s.batch_id, None)

    def _remember_error(self, batch_id: int, exc: SparkEOSError) -> None:
        if self.log is None:
            return
        try:
            self.log.record_error({"batch_id": batch_id, "type": type(exc).__name__,
                                   "message": str(exc), "time": time.time()})
        except Exception:
            pass

    def _fields(self, batch_id: int) -> dict[str, Any]:
        return {"query": self.pool.query_key, "sink": self.name, "batch": batch_id}
