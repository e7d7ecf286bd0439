"""The two-phase snapshot coordinator (Jet's snapshotCommitPrepare / Finish on Spark).

The coordinator drives one sink through one micro-batch at a time. It knows nothing
about Spark: a ``BatchRunner`` runs the per-partition task function somewhere (Spark
tasks in production, a loop in unit tests, a scheduler in the model check) and returns
the result of one successful attempt per partition.

Only the coordinator rolls back prepared state, and only for runs whose outcome is on
record (``aborted``, or ``decided`` for every attempt it does not name): a task's
``abort`` touches its own attempt's writes, never another's.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, final

import pyarrow as pa

from .commitlog import (
    ABORTED,
    BEGUN,
    DECIDED,
    FINISHED,
    IDENTITY_PINNED,
    OUTCOME,
    BatchState,
    CommitLog,
)
from .config import CoordinatorConfig, Guarantee
from .errors import (
    CommitLogError,
    ConfigurationError,
    RetriableError,
    SchemaMismatchError,
    SparkEOSError,
    TransactionAbortedError,
    cause_fix,
    describe_cause,
)
from .faults import FaultPlan
from .observe import BatchMetrics, log_event
from .protocol import CommitLocation, Receipt, TransactionalSink
from .txpool import AttemptRange, Transaction, TransactionPool

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

    def partitions(self) -> int: ...

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
    """Phase 1 of one task attempt, shipped to a task."""

    sink: TransactionalSink[Any]
    pool: TransactionPool
    batch_id: int
    run: int
    partitions: int
    task_attempts: int
    faults: FaultPlan

    def __call__(self, attempt: TaskAttempt, batches: Iterator[pa.RecordBatch]) -> TaskResult:
        partition = attempt.partition
        if not 0 <= partition < self.partitions:
            raise CommitLogError(
                f"task for partition {partition} ran, but the batch was planned with "
                f"{self.partitions} partitions (its transaction ID is not on record)",
                sink=self.pool.sink,
                batch_id=self.batch_id,
                fix="keep the batch DataFrame's partitioning stable between planning and "
                "execution (e.g. disable AQE partition coalescing for this query)",
            )
        tag = attempt_tag(attempt, self.task_attempts)
        txn = self.pool.transaction(self.batch_id, partition, self.run, tag)
        self.faults.before_begin(self.batch_id, partition, attempt.attempt_number)
        started = time.perf_counter()
        written = _write_transaction(self.sink, txn, batches)
        self.faults.task("task_fail_before_prepare", self.batch_id, partition,
                         attempt.attempt_number)
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

    def __call__(self, attempt: TaskAttempt, batches: Iterator[pa.RecordBatch]) -> TaskResult:
        # No begun record and no recovery: the ID only has to differ between attempts
        # that may run at once.
        txn = self.pool.transaction(self.batch_id, attempt.partition, 0,
                                    attempt.attempt_number)
        started = time.perf_counter()
        written = _write_transaction(self.sink, txn, batches)
        receipt = self.sink.prepare(written.handle)
        self.sink.commit(txn, receipt)
        return {"partition": attempt.partition, "rows": written.count,
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
        # (the coordinator's sweep of this ID cleans up).
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
        self.sink = sink.for_guarantee(config.guarantee)
        self.config = config
        self.log = log
        self.pool = TransactionPool(query_key, config.name)
        self.faults = faults or FaultPlan()
        self._states: dict[int, BatchState] | None = None
        self._meta: dict[str, Any] | None = None
        self._swept_all = False
        self._existing_checked = False

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
                  run=metrics.run, rows=metrics.rows, partitions=metrics.partitions,
                  prepare_ms=metrics.prepare_ms, decide_ms=metrics.decide_ms,
                  commit_ms=metrics.commit_ms, total_ms=metrics.total_ms)
        return metrics

    def recover(self, runner: BatchRunner | None = None, *,
                full: bool | None = None) -> list[dict[str, Any]]:
        """Finish decided batches, abort runs left without an outcome, sweep leftovers.

        Idempotent, and safe beside a live driver: an outcome is written once, so a
        run this recovery aborts can never be decided, and a decided run is only ever
        committed. ``full`` (default: on a coordinator's first call) also sweeps every
        batch still on record, for state that late task attempts prepared after the
        earlier sweeps.
        """
        states = self._load_states()
        full = not self._swept_all if full is None else full
        done: list[dict[str, Any]] = []
        for state in sorted(states.values(), key=lambda s: s.batch_id):
            for run in state.open_runs:
                held = self._settle(state, run, {"outcome": ABORTED, "reason": "recovery"})
                if held.get("outcome") == ABORTED:
                    log_event("recovery.aborted", **self._fields(state.batch_id), run=run,
                              partitions=state.begun[run].get("partitions"))
                    done.append({"batch_id": state.batch_id, "action": "rolled_back"})
                    if not full:
                        self._sweep([state])
            if state.needs_commit:
                self._commit_decided(state, runner, recovering=True)
                done.append({"batch_id": state.batch_id, "action": "committed"})
        if full:
            self._sweep(states.values())
            self._swept_all = True
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
            runner.run_without_output()
            return

        schema = runner.arrow_schema()
        # The sink judges the schema first: a batch it refuses must not pin anything.
        self.sink.validate(schema)
        self._check_schema(batch_id, schema)
        self._check_existing_output(batch_id)
        partitions = runner.partitions()
        m.partitions = partitions
        if partitions == 0:
            state = states.setdefault(batch_id, BatchState(batch_id))
            state.finished = log.claim(batch_id, FINISHED, {"participants": 0, "rows": 0})
            m.outcome = "committed"
            return

        self.pool.check_slot_free(batch_id, [s.batch_id for s in states.values() if s.unresolved])
        self._sweep_slot(batch_id, states)
        run = (state.last_attempt + 1) if state is not None else 0
        m.run = run
        begun = {"partitions": partitions, "slot": self.pool.slot_of(batch_id),
                 "tags": self.config.task_attempts}
        log.append(batch_id, BEGUN, begun, run)
        state = states.setdefault(batch_id, BatchState(batch_id))
        state.begun[run] = begun
        self.faults.driver("after_begun", batch_id)

        # Phase 1: every task attempt writes and prepares its own transaction.
        t0 = time.perf_counter()
        task = PrepareTask(self.sink, self.pool, batch_id, run, partitions,
                           self.config.task_attempts, self.faults)
        try:
            results = runner.run_tasks(task)
            participants = self._check_results(batch_id, partitions, results)
            self.sink.before_decision(batch_id, [p["receipt"] for p in participants])
        except Exception as exc:
            self._abort_run(state, run, exc)
            config_error = _task_configuration_error(exc, self.name, batch_id)
            if config_error is not None:
                raise config_error from exc
            advice = cause_fix(exc)
            raise TransactionAbortedError(
                f"phase 1 (prepare) failed: {describe_cause(exc, 1000)}; every transaction "
                "of the batch was rolled back",
                sink=self.name, batch_id=batch_id,
                fix=(advice or "fix the cause above and restart the query") + "; Spark "
                "re-runs this batch and nothing is lost or duplicated",
            ) from exc
        m.prepare_ms = _ms(t0)
        m.rows = sum(int(r["rows"]) for r in results)
        self.faults.driver("after_all_prepared", batch_id)

        # The decision: after this record, the batch must be committed.
        t1 = time.perf_counter()
        decided = {"outcome": DECIDED, "participants": participants, "rows": m.rows,
                   "slot": self.pool.slot_of(batch_id)}
        if self._settle(state, run, decided).get("outcome") != DECIDED:
            self._sweep([state], quiet=True)
            raise TransactionAbortedError(
                f"run {run} of the batch was recorded as aborted by another process "
                "(`sparkeos recover --force`, or a second driver on the same checkpoint) "
                "before this driver could decide it; nothing of it was committed",
                sink=self.name, batch_id=batch_id,
                fix="run one driver per checkpointLocation and `sparkeos recover` only "
                "while the query is stopped; restart the query and the batch is written "
                "again",
            )
        m.decide_ms = _ms(t1)
        self._pin_on_decision(schema)
        self.faults.decided(batch_id)
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
            {"partition": p, "tag": int(by_partition[p]["tag"]),
             "attempt": by_partition[p]["attempt"], "rows": by_partition[p]["rows"],
             "receipt": by_partition[p]["receipt"]}
            for p in range(partitions)
        ]

    def _settle(self, state: BatchState, run: int, outcome: dict[str, Any]) -> dict[str, Any]:
        """Record ``outcome`` for ``run`` unless another process recorded one first;
        return the outcome that holds."""
        held = self._require_log().claim(state.batch_id, OUTCOME, outcome, run)
        state.outcomes[run] = held
        return held

    def _decided_transactions(self, state: BatchState) -> list[tuple[Transaction, Receipt]]:
        run = state.decided_run
        assert run is not None and state.decided is not None
        return [
            (self.pool.transaction(state.batch_id, int(p["partition"]), run, int(p["tag"])),
             p["receipt"])
            for p in state.decided["participants"]
        ]

    def _commit_decided(
        self, state: BatchState, runner: BatchRunner | None, *, recovering: bool
    ) -> None:
        log = self._require_log()
        assert state.decided is not None
        items = self._decided_transactions(state)
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
        state.finished = log.claim(state.batch_id, FINISHED, {
            "participants": len(items), "rows": state.decided.get("rows", 0),
            "recovered": recovering})
        if recovering:
            log_event("recovery.committed", **self._fields(state.batch_id),
                      participants=len(items))
        self.faults.driver("after_finished", state.batch_id)
        # The batch is committed whatever happens here; leftovers a failing sweep leaves
        # are swept again when the slot is reused and on the next recovery.
        self._sweep([state], quiet=True)

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

    def _abort_run(self, state: BatchState, run: int, cause: BaseException) -> None:
        log_event("batch.aborting", **self._fields(state.batch_id), run=run,
                  cause=describe_cause(cause))
        held = self._settle(state, run, {"outcome": ABORTED, "reason": describe_cause(cause)})
        if held.get("outcome") == ABORTED:
            # The cause is what the user must see, not a failing sweep.
            self._sweep([state], quiet=True)

    # -- sweeping ---------------------------------------------------------------------------
    def _sweep(self, states: Iterable[BatchState], *, quiet: bool = False) -> None:
        """Roll back every transaction ID of the given batches that can never be
        committed: every run with an outcome, except the decided attempts.

        ``quiet``: log a failure instead of raising it (where the batch's fate is
        already settled; the next sweep of the same IDs tries again)."""
        ranges: list[AttemptRange] = []
        keep: set[str] = set()
        for state in states:
            for run, begun in state.begun.items():
                if run not in state.outcomes:
                    continue  # no outcome yet: it may still be decided
                ranges.append(AttemptRange(
                    self.pool.query_key, self.name, state.batch_id, run,
                    int(begun["partitions"]), int(begun.get("tags", 1))))
            if state.decided is not None:
                keep.update(txn.txn_id for txn, _ in self._decided_transactions(state))
        if not ranges:
            return
        try:
            self.sink.sweep(ranges, frozenset(keep))
        except Exception as exc:
            if not quiet:
                raise
            batches = sorted({r.batch_id for r in ranges})
            log_event("sweep.failed", logging.WARNING, query=self.pool.query_key,
                      sink=self.name, batches=batches, cause=describe_cause(exc))

    def _sweep_slot(self, batch_id: int, states: dict[int, BatchState]) -> None:
        """Before a batch reuses a slot, sweep the batch that used it before: late
        attempts of that batch may have prepared after its own sweep."""
        previous = states.get(batch_id - 2)
        if previous is not None and not previous.unresolved:
            self._sweep([previous])

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

    def _recorded_meta(self) -> dict[str, Any]:
        if self._meta is None:
            self._meta = self._require_log().read_meta() or {}
        return self._meta

    def _check_schema(self, batch_id: int, schema: pa.Schema) -> None:
        recorded = self._recorded_meta().get("schema")
        current = _schema_fields(schema)
        if recorded is None or recorded == current or self.sink.accepts_schema_change:
            return
        before = {name: typ for name, typ in recorded}
        after = {name: typ for name, typ in current}
        changes = [f"+{n}:{t}" for n, t in after.items() if n not in before]
        changes += [f"-{n}:{t}" for n, t in before.items() if n not in after]
        changes += [f"{n}:{before[n]}->{t}" for n, t in after.items()
                    if n in before and before[n] != t]
        raise SchemaMismatchError(
            "the batch's schema differs from the schema this sink has committed: "
            + (", ".join(changes) or "column order changed"),
            sink=self.name, batch_id=batch_id,
            fix="select/cast the DataFrame back to the recorded schema, or write the new "
            "schema under a new sink name; nothing of this batch was written",
        )

    def _check_existing_output(self, batch_id: int) -> None:
        """Before a sink that never decided a batch writes: refuse to write again what
        another query (a lost checkpoint) committed under this sink name."""
        if self._existing_checked or self.config.existing_output == "accept":
            return
        if self._recorded_meta().get(IDENTITY_PINNED):
            self._existing_checked = True
            return
        found = self.sink.output_of_other_queries(self.pool.query_key, self.name)
        if found:
            raise ConfigurationError(
                f"{type(self.sink).__name__} already holds committed output of sink name "
                f"{self.name!r} written by another query ({found}), and this query's commit "
                "log is new (a lost or different checkpoint): writing would put those rows "
                "there twice",
                sink=self.name, batch_id=batch_id,
                fix="restore the checkpoint the output was written with; or start this "
                "query where the old one stopped (e.g. a later startingOffsets) and pass "
                "exactly_once(..., existing_output='accept'); or, to re-process on purpose "
                "(the old rows stay), pass existing_output='accept'; or use another sink "
                "name or destination. Nothing was written",
            )
        self._existing_checked = True

    def _pin_on_decision(self, schema: pa.Schema) -> None:
        """Pin the schema and the destination once a batch is decided (never before: a
        batch the sink refused, or one that failed, must not make the corrected query
        look changed)."""
        meta = self._recorded_meta()
        if "schema" in meta and meta.get(IDENTITY_PINNED):
            return
        meta.update(self._require_log().read_meta() or {})
        meta.setdefault("schema", _schema_fields(schema))
        meta["identity"] = meta.get("identity") if meta.get(IDENTITY_PINNED) else (
            self.sink.identity())
        meta[IDENTITY_PINNED] = True
        self._require_log().write_meta(meta)

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


def _task_configuration_error(exc: BaseException, sink: str,
                              batch_id: int) -> ConfigurationError | None:
    """A ``ConfigurationError`` a task raised reaches the driver as text inside Spark's
    own exception; re-raise it as what it is (after the run was aborted)."""
    if isinstance(exc, ConfigurationError):
        return exc
    cause = describe_cause(exc)
    for kind in (SchemaMismatchError, ConfigurationError):
        marker = f"{kind.__name__}: "
        if marker in cause:
            problem = cause.split(marker, 1)[1].strip()
            return kind(f"{problem} (raised in a task; every transaction of the batch "
                        "was rolled back)", sink=sink, batch_id=batch_id,
                        fix="fix the configuration and restart the query; nothing of this "
                        "batch was committed")
    return None


def _schema_fields(schema: pa.Schema) -> list[list[str]]:
    return [[f.name, str(f.type)] for f in schema]
