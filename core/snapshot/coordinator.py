"""The two-phase snapshot coordinator (Jet's snapshotCommitPrepare / Finish on Spark).

The coordinator drives one sink through one micro-batch at a time. It knows nothing
about Spark: a ``BatchRunner`` runs the per-partition task function somewhere (Spark
tasks in production, a loop in unit tests, a scheduler in the model check) and returns
the result of one successful attempt per partition.

This module is the entry point and the error wrapping around it; the parts live in
their own modules: what the parts share (``scope``), the batch protocol (``batch``),
recovery, phase 2 and sweeps (``recovery``), the checks before a decision
(``checks``) and what runs in a task (``tasks``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, final

from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import ConfigurationError, SparkEOSError, describe_cause
from sparkeos.core.faults import FaultPlan
from sparkeos.core.observe import BatchMetrics, log_event
from sparkeos.core.protocol import Receipt, TransactionalSink

from .batch import ExactlyOnceBatch, ms_since, run_direct
from .checks import PreDecisionChecks
from .commitlog import BatchState, CommitLog, checkpoint_of_log
from .group import SINGLE, SinkGroup, members_of
from .overlap import CommitsInFlight, Starter, start_thread
from .recovery import Recovery
from .scope import Scope
from .tasks import (
    BatchRunner,
    CommitTask,
    DirectTask,
    PrepareTask,
    Runners,
    TaskAttempt,
    TaskFunction,
    TaskResult,
    attempt_tag,
)
from .txpool import DIRECT_RUNS, Transaction, TransactionPool

__all__ = [
    "BatchRunner",
    "CommitTask",
    "Coordinator",
    "DirectTask",
    "PrepareTask",
    "Runners",
    "TaskAttempt",
    "TaskFunction",
    "TaskResult",
    "attempt_tag",
]


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
        background: Starter = start_thread,
        durable_identity: bool = True,
    ) -> None:
        """``query_key``: the query's key (``core.streaming.identity``); ``durable_identity``
        False for a key of this query run only (at-least-once without a durable
        identity: the replay rule then never skips)."""
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
        if config.guarantee is Guarantee.EXACTLY_ONCE and (log is None or not durable_identity):
            raise ConfigurationError(
                "exactly-once needs a commit log and the query's durable identity",
                sink=config.name, fix="give the query a checkpointLocation",
            )
        self.scope = Scope(
            members={m: part.for_guarantee(config.guarantee) for m, part in members.items()},
            grouped=isinstance(sink, SinkGroup), config=config, log=log,
            pool=TransactionPool(query_key, config.name, durable_identity),
            faults=faults or FaultPlan())
        self.checks = PreDecisionChecks(self.scope)
        self.recovery = Recovery(self.scope)
        self._direct_run = random.randrange(DIRECT_RUNS.start, DIRECT_RUNS.stop)
        self.in_flight = CommitsInFlight(background)

    @property
    def name(self) -> str:
        return self.scope.name

    @property
    def members(self) -> dict[str, TransactionalSink[Any]]:
        return self.scope.members

    @property
    def grouped(self) -> bool:
        return self.scope.grouped

    @property
    def config(self) -> CoordinatorConfig:
        return self.scope.config

    @property
    def log(self) -> CommitLog | None:
        return self.scope.log

    @property
    def pool(self) -> TransactionPool:
        return self.scope.pool

    @property
    def faults(self) -> FaultPlan:
        return self.scope.faults

    @property
    def sink(self) -> TransactionalSink[Any]:
        """The only sink of a coordinator that is not a group."""
        if self.grouped:
            raise ConfigurationError(f"{self.name} is a sink group; use .members",
                                     sink=self.name)
        return self.members[SINGLE]

    # -- public entry points ----------------------------------------------------------
    def run_batch(self, batch_id: int, runner: Runners,
                  on_complete: Callable[[BatchMetrics], None] | None = None) -> BatchMetrics:
        """Run one batch. With ``overlap_commits``, return once it is decided and commit
        it in the background (``core.snapshot.overlap``); ``on_complete`` gets the metrics once
        its records are committed (at once without overlap)."""
        metrics = BatchMetrics(self.pool.query_key, self.name, batch_id,
                               self.config.guarantee.value)
        started = time.perf_counter()
        try:
            self._await_earlier(batch_id, metrics)
            runners = self._runners(runner)
            decided = None
            if self.config.guarantee is Guarantee.EXACTLY_ONCE:
                batch = ExactlyOnceBatch(self.scope, self.checks, self.recovery, batch_id,
                                         runners, metrics, busy=self.in_flight.busy,
                                         held=self.in_flight.held)
                # None (unresolved: no adapter holds the end of a query here) is off.
                decided = batch.run(defer_commit=self.config.overlap_commits is True)
            else:
                run_direct(self.scope, self.recovery, self._direct_run, batch_id, runners,
                           metrics)
            if decided is not None:
                self._commit_in_background(batch, decided, started, on_complete)
        except BaseException as exc:
            self.batch_failed(batch_id, exc)
            raise
        metrics.total_ms = ms_since(started)
        log_event("batch.done", **self.scope.fields(batch_id), outcome=metrics.outcome,
                  run=metrics.run, rows=metrics.rows, partitions=metrics.partitions,
                  prepare_ms=metrics.prepare_ms, decide_ms=metrics.decide_ms,
                  commit_ms=metrics.commit_ms, total_ms=metrics.total_ms,
                  recover_ms=metrics.recover_ms, wait_ms=metrics.wait_ms or None)
        if decided is None:
            metrics.visible_ms = metrics.total_ms
            if on_complete is not None:
                on_complete(metrics)
        return metrics

    def flush(self) -> None:
        """Wait until the batch committing in the background (``overlap_commits``) is
        committed; raise its failure (once; the query's next batch raises it again:
        ``core.snapshot.overlap``)."""
        self.in_flight.wait(for_the_query=False)

    def _await_earlier(self, batch_id: int, metrics: BatchMetrics) -> None:
        """Before a batch: raise the failure of a background phase 2 that ended, and
        wait for one still running on this batch's slot (or this batch itself)."""
        self.in_flight.raise_failure()
        busy = self.in_flight.batch_id
        if busy is not None and (busy == batch_id
                                 or self.pool.slot_of(busy) == self.pool.slot_of(batch_id)):
            self._wait_for_earlier(metrics)

    def _wait_for_earlier(self, metrics: BatchMetrics) -> None:
        """Wait for the batch in flight (raising its failure), timed as ``wait_ms``."""
        waited = time.perf_counter()
        self.in_flight.wait()
        metrics.wait_ms += ms_since(waited)

    def _commit_in_background(self, batch: ExactlyOnceBatch, state: BatchState,
                              started: float,
                              on_complete: Callable[[BatchMetrics], None] | None) -> None:
        """Phase 2 of a decided batch beside the next batch: after the batch before it
        (records become visible in batch order; its failure is raised here)."""
        metrics, batch_id = batch.metrics, batch.batch_id
        self._wait_for_earlier(metrics)
        self.scope.purge(batch_id)
        held: dict[str, int] = {}
        for member, _txn, _receipt in self.scope.decided_transactions(state):
            held[member] = held.get(member, 0) + 1

        checkpoint = None if self.log is None else checkpoint_of_log(self.log.location)

        def phase2() -> None:
            try:
                self.scope.faults.counted_by_spark(batch_id, checkpoint)
                batch.commit(state, purge=False)
            except Exception as exc:
                log_event("batch.commit_failed", logging.WARNING,
                          **self.scope.fields(batch_id), cause=describe_cause(exc))
                raise
            metrics.visible_ms = ms_since(started)
            log_event("batch.committed", **self.scope.fields(batch_id),
                      commit_ms=metrics.commit_ms, visible_ms=metrics.visible_ms)
            if on_complete is not None:
                on_complete(metrics)

        self.in_flight.start(batch_id, phase2, f"sparkeos-commit-{self.name}-{batch_id}",
                             held)

    def recover(self, runner: Runners | None = None, *,
                full: bool | None = None,
                guard: Callable[[], None] | None = None) -> list[dict[str, Any]]:
        """Finish decided batches, abort runs left without an outcome, sweep leftovers.

        Idempotent, and safe beside a live driver: an outcome is written once, so a
        run this recovery aborts can never be decided, and a decided run is only ever
        committed. ``full`` (default: on a coordinator's first call) also sweeps every
        batch still on record, for state that late task attempts prepared after the
        earlier sweeps. ``guard`` runs after the log was read, before any run is
        aborted, and may refuse by raising (``sparkeos recover`` checks the lease there).
        """
        runners = self._runners(runner) if runner is not None else {}
        return self.recovery.recover(runners, full=full, guard=guard)

    def states(self) -> dict[int, BatchState]:
        return dict(self.scope.load_states())

    # -- helpers -----------------------------------------------------------------------------
    def _runners(self, runner: Runners) -> dict[str, BatchRunner]:
        if not isinstance(runner, Mapping):
            return {member: runner for member in self.members}
        missing = sorted(set(self.members) - set(runner))
        if missing:
            raise ConfigurationError(f"no batch runner for members {missing}", sink=self.name,
                                     fix="this is a bug in the adapter; please report it")
        return dict(runner)

    def _decided_transactions(
        self, state: BatchState
    ) -> list[tuple[str, Transaction, Receipt]]:
        """(member, transaction, receipt) of every decided participant."""
        return self.scope.decided_transactions(state)

    def batch_failed(self, batch_id: int, exc: BaseException) -> None:
        """A batch failed, wherever it ran: re-read the log before anything else, and
        keep a sparkeos error for ``sparkeos status``."""
        self.scope.forget_states()
        if isinstance(exc, SparkEOSError):
            self._remember_error(batch_id, exc)

    def _remember_error(self, batch_id: int, exc: SparkEOSError) -> None:
        if self.log is None:
            return
        try:
            self.log.record_error({"batch_id": batch_id, "type": type(exc).__name__,
                                   "message": str(exc), "time": time.time()})
        except Exception:
            pass
