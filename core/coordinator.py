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
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
from .group import SINGLE, SinkGroup, members_of
from .observe import BatchMetrics, log_event
from .protocol import CommitLocation, Receipt, TransactionalSink
from .steps import COMMIT, commit_step
from .txpool import DIRECT_RUNS, AttemptRange, Transaction, TransactionPool

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
        written = _write_transaction(self.sink, txn, batches, lambda: self.faults.task(
            "kill_task_mid_write", self.batch_id, partition, attempt.attempt_number))
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
        commit_step(COMMIT, txn)
        if self.recovering:
            self.sink.recover_commit(txn, receipt)
        else:
            self.sink.commit(txn, receipt)
        if self.in_task:
            # The driver-side point, reached from the task that committed first.
            self.faults.task("after_first_commit", txn.batch_id, txn.partition, 0)
            self.faults.task("kill_executor_after_commit", txn.batch_id, txn.partition,
                             _spark_attempt_number())
        return txn.partition


def _spark_attempt_number() -> int:
    """The running Spark task's attempt number (0 outside a Spark task)."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
    except ImportError:
        return 0
    return context.attemptNumber() if context is not None else 0


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


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 3)


Runners = BatchRunner | Mapping[str, BatchRunner]
"""One runner, or one per member of a ``SinkGroup`` (each member's own DataFrame)."""


@final
class Coordinator:
    """Runs batches of one sink, or of a ``SinkGroup`` under one decision, under one
    guarantee; entry points are final."""

    def __init__(
        self,
        sink: TransactionalSink[Any] | SinkGroup,
        config: CoordinatorConfig,
        log: CommitLog | None,
        query_key: str,
        faults: FaultPlan | None = None,
    ) -> None:
        members = members_of(sink)
        for member, part in members.items():
            if config.guarantee not in part.guarantees:
                offered = ", ".join(sorted(g.value for g in part.guarantees))
                label = f" (member {member!r})" if member != SINGLE else ""
                raise ConfigurationError(
                    f"{type(part).__name__}{label} cannot give the {config.guarantee.value} "
                    f"guarantee (it offers: {offered})",
                    sink=config.name,
                    fix="ask for a guarantee the sink supports, or use another sink",
                )
        if config.guarantee is Guarantee.EXACTLY_ONCE and log is None:
            raise ConfigurationError(
                "exactly-once needs a commit log", sink=config.name,
                fix="give the query a checkpointLocation",
            )
        self.members = {m: part.for_guarantee(config.guarantee) for m, part in members.items()}
        self.grouped = isinstance(sink, SinkGroup)
        self.config = config
        self.log = log
        self.pool = TransactionPool(query_key, config.name)
        self.faults = faults or FaultPlan()
        self._states: dict[int, BatchState] | None = None
        self._meta: dict[str, Any] | None = None
        self._swept_all = False
        self._direct_swept = False
        self._direct_run = random.randrange(DIRECT_RUNS.start, DIRECT_RUNS.stop)
        self._existing_checked = False

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def sink(self) -> TransactionalSink[Any]:
        """The only sink of a coordinator that is not a group."""
        if self.grouped:
            raise ConfigurationError(f"{self.name} is a sink group; use .members",
                                     sink=self.name)
        return self.members[SINGLE]

    # -- public entry points ----------------------------------------------------------
    def run_batch(self, batch_id: int, runner: Runners) -> BatchMetrics:
        metrics = BatchMetrics(self.pool.query_key, self.name, batch_id,
                               self.config.guarantee.value)
        started = time.perf_counter()
        try:
            runners = self._runners(runner)
            if self.config.guarantee is Guarantee.EXACTLY_ONCE:
                self._run_exactly_once(batch_id, runners, metrics)
            else:
                self._run_direct(batch_id, runners, metrics)
        except BaseException as exc:
            self._states = None  # re-read the log before anything else
            if isinstance(exc, SparkEOSError):
                self._remember_error(batch_id, exc)
            raise
        metrics.total_ms = _ms(started)
        log_event("batch.done", **self._fields(batch_id), outcome=metrics.outcome,
                  run=metrics.run, rows=metrics.rows, partitions=metrics.partitions,
                  prepare_ms=metrics.prepare_ms, decide_ms=metrics.decide_ms,
                  commit_ms=metrics.commit_ms, total_ms=metrics.total_ms,
                  recover_ms=metrics.recover_ms)
        return metrics

    def recover(self, runner: Runners | None = None, *,
                full: bool | None = None) -> list[dict[str, Any]]:
        """Finish decided batches, abort runs left without an outcome, sweep leftovers.

        Idempotent, and safe beside a live driver: an outcome is written once, so a
        run this recovery aborts can never be decided, and a decided run is only ever
        committed. ``full`` (default: on a coordinator's first call) also sweeps every
        batch still on record, for state that late task attempts prepared after the
        earlier sweeps.
        """
        runners = self._runners(runner) if runner is not None else {}
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
                self._commit_decided(state, runners, recovering=True)
                done.append({"batch_id": state.batch_id, "action": "committed"})
        if full:
            self._sweep(states.values())
            self._swept_all = True
        return done

    def states(self) -> dict[int, BatchState]:
        return dict(self._load_states())

    # -- exactly-once ----------------------------------------------------------------------
    def _run_exactly_once(self, batch_id: int, runners: dict[str, BatchRunner],
                          m: BatchMetrics) -> None:
        log = self._require_log()
        t_recover = time.perf_counter()
        m.recovered = self.recover(runners)
        m.recover_ms = _ms(t_recover)
        states = self._load_states()
        state = states.get(batch_id)
        if state is not None and (state.finished is not None or state.decided is not None):
            # Invariant 3: the batch was decided before; its commits are done by
            # recover() above, so a re-run writes nothing new.
            m.outcome = "replayed"
            log_event("batch.replay_skipped", **self._fields(batch_id))
            # Every member's DataFrame derives from the batch's: running one runs the
            # whole upstream plan (its state stores included) once.
            next(iter(runners.values())).run_without_output()
            return

        schemas = {member: runners[member].arrow_schema() for member in self.members}
        # The sinks judge the schema first: a batch they refuse must not pin anything.
        for member, part in self.members.items():
            part.validate(schemas[member])
        self._check_schema(batch_id, schemas)
        self._check_existing_output(batch_id)
        layout = self._layout(runners)
        for member, part in self.members.items():
            if layout[member][1]:
                part.check_participants(layout[member][1])
        partitions = sum(count for _offset, count in layout.values())
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
        begun: dict[str, Any] = {"partitions": partitions, "slot": self.pool.slot_of(batch_id),
                                 "tags": self.config.task_attempts}
        if self.grouped:
            begun["members"] = {member: list(place) for member, place in layout.items()}
        log.append(batch_id, BEGUN, begun, run)
        state = states.setdefault(batch_id, BatchState(batch_id))
        state.begun[run] = begun
        self.faults.driver("after_begun", batch_id)

        # Phase 1: every task attempt of every member writes and prepares its own
        # transaction.
        t0 = time.perf_counter()
        try:
            results: list[TaskResult] = []
            for member, part in self.members.items():
                offset, count = layout[member]
                if count:
                    results += runners[member].run_tasks(PrepareTask(
                        part, self.pool, batch_id, run, count, self.config.task_attempts,
                        self.faults, offset, member))
            participants = self._check_results(batch_id, layout, results)
            m.partitions = len(participants)
            for member, part in self.members.items():
                part.before_decision(batch_id, [p["receipt"] for p in participants
                                                if p.get("member", SINGLE) == member])
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
        self._pin_on_decision(schemas)
        self.faults.decided(batch_id)
        self.faults.driver("after_decided", batch_id)

        # Phase 2.
        t2 = time.perf_counter()
        try:
            self._commit_decided(state, runners, recovering=False)
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

    def _runners(self, runner: Runners) -> dict[str, BatchRunner]:
        if not isinstance(runner, Mapping):
            return {member: runner for member in self.members}
        missing = sorted(set(self.members) - set(runner))
        if missing:
            raise ConfigurationError(f"no batch runner for members {missing}", sink=self.name,
                                     fix="this is a bug in the adapter; please report it")
        return dict(runner)

    def _layout(self, runners: dict[str, BatchRunner]) -> dict[str, tuple[int, int]]:
        """Each member's (offset, count) among the group's participants."""
        layout: dict[str, tuple[int, int]] = {}
        offset = 0
        for member in self.members:
            count = runners[member].partitions()
            layout[member] = (offset, count)
            offset += count
        return layout

    def _check_results(
        self, batch_id: int, layout: Mapping[str, tuple[int, int]], results: list[TaskResult]
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
                sink=self.name, batch_id=batch_id,
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

    def _settle(self, state: BatchState, run: int, outcome: dict[str, Any]) -> dict[str, Any]:
        """Record ``outcome`` for ``run`` unless another process recorded one first;
        return the outcome that holds."""
        held = self._require_log().claim(state.batch_id, OUTCOME, outcome, run)
        state.outcomes[run] = held
        return held

    def _decided_transactions(
        self, state: BatchState
    ) -> list[tuple[str, Transaction, Receipt]]:
        """(member, transaction, receipt) of every decided participant."""
        run = state.decided_run
        assert run is not None and state.decided is not None
        return [
            (str(p.get("member", SINGLE)),
             self.pool.transaction(state.batch_id, int(p["partition"]), run, int(p["tag"])),
             p["receipt"])
            for p in state.decided["participants"]
        ]

    def _commit_decided(
        self, state: BatchState, runners: Mapping[str, BatchRunner], *, recovering: bool
    ) -> None:
        log = self._require_log()
        assert state.decided is not None
        decided = self._decided_transactions(state)
        unknown = sorted({member for member, _t, _r in decided} - set(self.members))
        if unknown:
            raise ConfigurationError(
                f"batch {state.batch_id} was decided with members {unknown}, which this "
                "query does not have: every member of a decided batch must be committed",
                sink=self.name, batch_id=state.batch_id,
                fix="restart the query with the members it had (members can be added or "
                "removed once every decided batch is finished)")
        first = True
        for member, part in self.members.items():
            items = [(txn, receipt) for m, txn, receipt in decided if m == member]
            if not items:
                continue
            runner = runners.get(member)
            in_tasks = part.commit_location is CommitLocation.TASKS and runner is not None
            commit = CommitTask(part, recovering, self.faults, in_tasks)
            if runner is not None and in_tasks:
                runner.run_in_tasks(commit, items)
            elif part.commit_location is CommitLocation.TASKS:
                # Recovery without Spark (`sparkeos recover`): this process commits what
                # the tasks would have; it must reach the staged data (a shared
                # directory or HDFS), else the sink says which host holds it.
                for item in items:
                    commit(item)
            else:
                self._commit_on_driver(commit, items, state.batch_id, first)
            first = False
        self.faults.driver("after_all_commits", state.batch_id)
        state.finished = log.claim(state.batch_id, FINISHED, {
            "participants": len(decided), "rows": state.decided.get("rows", 0),
            "recovered": recovering})
        if recovering:
            log_event("recovery.committed", **self._fields(state.batch_id),
                      participants=len(decided))
        self.faults.driver("after_finished", state.batch_id)
        # The batch is committed whatever happens here; leftovers a failing sweep leaves
        # are swept again when the slot is reused and on the next recovery.
        self._sweep([state], quiet=True)

    def _commit_on_driver(
        self, commit: CommitTask, items: list[tuple[Transaction, Receipt]], batch_id: int,
        first_member: bool,
    ) -> None:
        first, rest = items[0], items[1:]
        commit(first)
        if first_member:
            self.faults.driver("after_first_commit", batch_id)
        if rest:
            workers = min(self.config.commit_parallelism, len(rest))
            if workers == 1:
                for item in rest:
                    commit(item)
            else:
                with ThreadPoolExecutor(workers, thread_name_prefix="sparkeos-commit") as ex:
                    list(ex.map(commit, rest))

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

        Every member sweeps the group's whole range with the group's decided IDs kept:
        a member's destination holds only its own IDs, and every other ID the range
        covers is doomed in every member alike.

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
                keep.update(txn.txn_id for _m, txn, _r in self._decided_transactions(state))
        if not ranges:
            return
        failures: list[Exception] = []
        for part in self.members.values():
            try:
                part.sweep(ranges, frozenset(keep))
            except Exception as exc:
                failures.append(exc)
        if not failures:
            return
        if not quiet:
            raise failures[0]
        batches = sorted({r.batch_id for r in ranges})
        for failure in failures:
            log_event("sweep.failed", logging.WARNING, query=self.pool.query_key,
                      sink=self.name, batches=batches, cause=describe_cause(failure))

    def _sweep_slot(self, batch_id: int, states: dict[int, BatchState]) -> None:
        """Before a batch reuses a slot, sweep the batch that used it before: late
        attempts of that batch may have prepared after its own sweep."""
        previous = states.get(batch_id - 2)
        if previous is not None and not previous.unresolved:
            self._sweep([previous])

    # -- at-least-once / none ---------------------------------------------------------------
    def _run_direct(self, batch_id: int, runners: dict[str, BatchRunner],
                    m: BatchMetrics) -> None:
        for member, part in self.members.items():
            part.validate(runners[member].arrow_schema())
        layout = self._layout(runners)
        if not self._direct_swept:
            self._sweep_direct(batch_id, sum(count for _offset, count in layout.values()))
        t0 = time.perf_counter()
        for member, (offset, count) in layout.items():
            m.partitions += count
            if count:
                results = runners[member].run_tasks(
                    DirectTask(self.members[member], self.pool, batch_id, self._direct_run,
                               offset, self.faults))
                m.rows += sum(int(r["rows"]) for r in results)
        m.prepare_ms = _ms(t0)
        m.outcome = "direct"

    def _sweep_direct(self, batch_id: int, partitions: int) -> None:
        """Before a query run's first batch (the one a crashed run died in, which Spark
        replays first): roll back what tasks of earlier runs left under this batch's IDs
        (a task killed mid-write leaves its claim or prepared state behind). Those runs
        are over, and a direct task's transaction is committed by the task itself or
        never, so this removes only what nobody will commit; it blocks nothing (this
        run's IDs are its own), it only cleans up. Connectors whose sweep lists what
        they hold find every earlier run; the default sweep, which names IDs, cannot."""
        ranges = [AttemptRange(self.pool.query_key, self.name, batch_id, 0, partitions,
                               self.config.task_attempts, any_direct_run=True)]
        for part in self.members.values():
            part.sweep(ranges, frozenset())
        self._direct_swept = True

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

    def _recorded_schemas(self) -> dict[str, Any]:
        meta = self._recorded_meta()
        if self.grouped:
            return dict(meta.get("schemas") or {})
        return {SINGLE: meta["schema"]} if "schema" in meta else {}

    def _check_schema(self, batch_id: int, schemas: Mapping[str, pa.Schema]) -> None:
        recorded_all = self._recorded_schemas()
        for member, schema in schemas.items():
            recorded = recorded_all.get(member)
            current = _schema_fields(schema)
            part = self.members[member]
            if recorded is None or recorded == current or part.accepts_schema_change:
                continue
            before = {name: typ for name, typ in recorded}
            after = {name: typ for name, typ in current}
            changes = [f"+{n}:{t}" for n, t in after.items() if n not in before]
            changes += [f"-{n}:{t}" for n, t in before.items() if n not in after]
            changes += [f"{n}:{before[n]}->{t}" for n, t in after.items()
                        if n in before and before[n] != t]
            whose = f"member {member!r} of this sink group" if member != SINGLE else (
                "this sink")
            raise SchemaMismatchError(
                f"the batch's schema differs from the schema {whose} has committed: "
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
        for part in self.members.values():
            found = part.output_of_other_queries(self.pool.query_key, self.name)
            if found:
                raise ConfigurationError(
                    f"{type(part).__name__} already holds committed output of sink name "
                    f"{self.name!r} written by another query ({found}), and this query's "
                    "commit log is new (a lost or different checkpoint): writing would put "
                    "those rows there twice",
                    sink=self.name, batch_id=batch_id,
                    fix="restore the checkpoint the output was written with; or start this "
                    "query where the old one stopped (e.g. a later startingOffsets) and pass "
                    "exactly_once(..., existing_output='accept'); or, to re-process on "
                    "purpose (the old rows stay), pass existing_output='accept'; or use "
                    "another sink name or destination. Nothing was written",
                )
        self._existing_checked = True

    def _pin_on_decision(self, schemas: Mapping[str, pa.Schema]) -> None:
        """Pin the schema and the destination once a batch is decided (never before: a
        batch the sink refused, or one that failed, must not make the corrected query
        look changed)."""
        meta = self._recorded_meta()
        key = "schemas" if self.grouped else "schema"
        if key in meta and meta.get(IDENTITY_PINNED):
            return
        meta.update(self._require_log().read_meta() or {})
        if self.grouped:
            meta.setdefault("schemas", {m: _schema_fields(s) for m, s in schemas.items()})
        else:
            meta.setdefault("schema", _schema_fields(schemas[SINGLE]))
        identity = (SinkGroup(self.members).identity() if self.grouped
                    else self.members[SINGLE].identity())
        meta["identity"] = meta.get("identity") if meta.get(IDENTITY_PINNED) else identity
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
