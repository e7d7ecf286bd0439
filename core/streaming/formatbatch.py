"""The batch protocol split across the processes of Spark's Python streaming writer
(``writeStream.format("sparkeos-...")``, ``core.streaming.streamformat``).

The ``foreachBatch`` route runs a batch from one driver-side call. A Python data source
gets three calls in three processes instead, and this module runs the same
``ExactlyOnceBatch`` steps in each:

* **planning** (``plan``: ``streamWriter()`` in a planner worker on the driver host,
  before the batch's tasks): recovery, the checks, ``begun``. The batch being planned is
  the latest entry of Spark's ``<checkpoint>/offsets`` (Spark writes it before planning
  the batch and runs that batch again after a restart); the participant count is not
  known there, so ``begun`` records ``max_partitions`` as the plan's upper bound, and a
  task above it refuses to write (``PrepareTask``).
* **phase 1** (``write()`` in each task): ``PrepareTask`` as in the foreachBatch route;
  its result is the commit message.
* **the decision and phase 2** (``commit(messages, batch_id)`` in a commit worker on
  the driver host): the results are accepted, the run decided and committed; sinks that
  commit in tasks commit from that process, as ``sparkeos recover`` does.

``abort`` rolls back the runs of the batch still without an outcome. Every step is the
one the foreachBatch route takes, on the same commit log, so ``sparkeos status`` and
``recover`` read it alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import CommitLogError, ConfigurationError
from sparkeos.core.faults import FaultPlan, driver_group
from sparkeos.core.observe import BatchMetrics, log_event
from sparkeos.core.protocol import TransactionalSink
from sparkeos.core.snapshot.batch import ExactlyOnceBatch, Opened, ms_since
from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.group import SINGLE, for_checkpoint
from sparkeos.core.snapshot.lease import driver_pid, lease_record
from sparkeos.core.snapshot.replay import note_replays
from sparkeos.core.snapshot.tasks import DirectTask, PrepareTask, TaskResult
from sparkeos.core.snapshot.txpool import DIRECT_RUNS
from sparkeos.core.storage.logstores import open_store
from sparkeos.core.storage.registry import split_uri

from . import identity
from .queryrun import claim_log, refuse_unfinished_log
from .spark import require_durable_checkpoint
from .tasklease import TaskRenewal


@dataclass(frozen=True)
class PlannedBatch:
    """What the planning side hands to every task of one batch (pickled with the
    writer): which batch and run the tasks write, and how."""

    batch_id: int
    query_id: str | None
    """Spark's query ID as the planning read it (``core.streaming.identity``); None: the
    planning had none (an at-least-once format without a checkpointLocation option:
    the tasks take the running query's)."""
    run: int | None
    """The run ``begun`` recorded; None when the batch needs no phase 1 (decided
    before: its tasks write nothing) or under a weaker guarantee."""
    task: PrepareTask | DirectTask | None
    max_partitions: int
    lease: TaskRenewal | None = None
    """How the tasks keep the query's lease while they write (exactly-once)."""


class FormatQuery:
    """One sink of one query as the format route's processes each rebuild it: the
    commit log under the checkpoint, the claim of it, the coordinator."""

    def __init__(self, sink: TransactionalSink[Any], config: CoordinatorConfig,
                 max_partitions: int) -> None:
        self.config = config
        self.max_partitions = max_partitions
        self.faults = crash_whole_job(FaultPlan.from_env())
        if config.guarantee is not Guarantee.EXACTLY_ONCE:
            # Without the option the planning has no identity; each task reads the
            # running query's (``run_task``).
            self.location = (resolve_checkpoint(config) if config.checkpoint_location
                             else None)
            self.identity = identity.of_checkpoint(self.location)
            self.query_id = self.identity.query_id
            self.log: CommitLog | None = None
            self.coordinator = Coordinator(sink, config, None, self.identity.key,
                                           self.faults,
                                           durable_identity=self.identity.durable)
            return
        self.location = resolve_checkpoint(config)
        self.identity = identity.of_checkpoint(self.location)
        query_id = self.identity.query_id
        if query_id is None:
            raise CommitLogError(
                f"the checkpoint {self.location} has no readable query metadata "
                "(<checkpoint>/metadata, which Spark writes when the query starts)",
                sink=config.name,
                fix="give the same checkpointLocation Spark uses, on a file system sparkeos "
                "reaches from Python (a local or mounted path, hdfs://, webhdfs://, s3a://)")
        self.query_id = query_id
        self.log = CommitLog(open_store(sink_log_location(self.location, config.name)))
        bound = _bound(sink, self.location, config.name)
        key = claim_log(self.log, query_id, bound, config.name)
        self.coordinator = Coordinator(bound, config, self.log, key, self.faults)

    @property
    def sink(self) -> TransactionalSink[Any]:
        return self.coordinator.sink

    def keep_lease(self, batch_id: int) -> dict[str, Any] | None:
        """Tell operator commands a batch of the query is running: written at its
        planning (before ``begun``) and its commit, renewed by its tasks and its commit
        while they run (``core.snapshot.lease``). It names the driver's JVM, which lives as long
        as the query run, not this worker."""
        if self.log is None or self.query_id is None:
            return None
        record = lease_record(self.query_id, None, self.config.lease_ttl_s,
                              pid=driver_pid(), batch=batch_id)
        self.log.write_lease(record)
        return record

    def release_lease(self, batch_id: int) -> None:
        """The batch is committed or aborted: nothing of the query is open until the
        next batch's planning takes the lease again."""
        if self.log is None or self.query_id is None:
            return
        try:
            self.log.write_lease(lease_record(self.query_id, None, self.config.lease_ttl_s,
                                              released=True, pid=driver_pid(),
                                              batch=batch_id))
        except Exception as exc:  # it expires by itself; the batch's fate is settled
            log_event("lease.write_failed", logging.WARNING, log=self.log.location,
                      cause=str(exc))

    # -- planning ------------------------------------------------------------------------
    def plan(self, schema: pa.Schema) -> PlannedBatch:
        """Before the tasks of the batch being planned: recovery, the checks, ``begun``."""
        if self.config.guarantee is not Guarantee.EXACTLY_ONCE:
            return self._plan_direct(schema)
        assert self.location is not None and self.query_id is not None  # exactly-once
        batch_id = planned_batch(self.location)
        record = self.keep_lease(batch_id)
        assert self.log is not None and record is not None
        lease = TaskRenewal(self.log.location, record, time.time())
        scope = self.coordinator.scope
        batch = self._batch(batch_id, {SINGLE: _Planned(self.max_partitions, schema)},
                            BatchMetrics(scope.pool.query_key, scope.name, batch_id,
                                         self.config.guarantee.value))
        try:
            opened = batch.open()
        except BaseException as exc:
            self.coordinator.batch_failed(batch_id, exc)
            self.release_lease(batch_id)  # the query fails: Spark calls no abort()
            raise
        if opened is None:
            log_event("format.batch_skipped", **scope.fields(batch_id),
                      outcome=batch.metrics.outcome)
            return PlannedBatch(batch_id, self.query_id, None, None, self.max_partitions)
        task = PrepareTask(self.sink, scope.pool, batch_id, opened.run, self.max_partitions,
                           self.config.task_attempts, scope.faults)
        return PlannedBatch(batch_id, self.query_id, opened.run, task, self.max_partitions,
                            lease)

    def _plan_direct(self, schema: pa.Schema) -> PlannedBatch:
        """Each task commits its own transaction, under the batch ID it runs in. The
        first planning in a process (a restart's) first sweeps what earlier runs' tasks
        left under the batch being planned (``Recovery.sweep_direct``: claims, staged
        files, transactions left open), as the foreachBatch route does."""
        scope = self.coordinator.scope
        self.sink.validate(schema)
        self._sweep_direct_if_replayed()
        batch_id = -1  # each task takes its own (``run_task``)
        # A run number of its own per batch: a replayed batch never meets the IDs an
        # earlier, killed run committed or left claimed.
        run = random.randrange(DIRECT_RUNS.start, DIRECT_RUNS.stop)
        task = DirectTask(self.sink, scope.pool, batch_id, run, 0, scope.faults)
        return PlannedBatch(batch_id, self.query_id, None, task, self.max_partitions)

    def _sweep_direct_if_replayed(self) -> None:
        """A batch planned in this process for the first time, or again (a restart of
        the query, which Spark may plan in a Python worker it reuses): sweep what
        earlier runs' tasks left under it."""
        if self.location is None or self.query_id is None:
            return  # no batch to name (the tasks' IDs keep runs apart)
        batch = planned_batch(self.location)
        key = (self.location, self.query_id, self.config.name)
        last = _PLANNED_DIRECT.get(key)
        if last is None or batch <= last:
            refuse_unfinished_log(self.location, self.config.name)
            self.coordinator.recovery.sweep_direct(batch, self.max_partitions)
        _PLANNED_DIRECT[key] = batch

    # -- the decision and phase 2 ------------------------------------------------------
    def commit(self, batch_id: int, results: Sequence[TaskResult],
               schema: pa.Schema) -> BatchMetrics:
        """Accept the tasks' results, decide the run and commit it (or, for a batch
        decided before, finish it)."""
        scope = self.coordinator.scope
        metrics = BatchMetrics(scope.pool.query_key, scope.name, batch_id,
                               self.config.guarantee.value)
        warn_many_partitions(scope.fields(batch_id), len(results))
        if self.config.guarantee is not Guarantee.EXACTLY_ONCE:
            metrics.outcome, metrics.partitions = "direct", len(results)
            metrics.rows = sum(int(r.get("rows", 0)) for r in results)
            note_replays(scope.name, scope.pool.query_key, batch_id, results, metrics)
            return metrics
        started = time.perf_counter()
        record = self.keep_lease(batch_id)
        assert self.log is not None and record is not None
        try:
            with TaskRenewal(self.log.location, record, time.time()).renewing():
                self._commit(batch_id, results, schema, metrics)
        except BaseException as exc:
            self.coordinator.batch_failed(batch_id, exc)
            raise  # Spark calls abort(), which releases the lease
        self.release_lease(batch_id)
        metrics.total_ms = ms_since(started)
        log_event("batch.done", **scope.fields(batch_id), outcome=metrics.outcome,
                  run=metrics.run, rows=metrics.rows, partitions=metrics.partitions,
                  decide_ms=metrics.decide_ms, commit_ms=metrics.commit_ms,
                  total_ms=metrics.total_ms, route="format")
        return metrics

    def _commit(self, batch_id: int, results: Sequence[TaskResult], schema: pa.Schema,
                metrics: BatchMetrics) -> None:
        scope = self.coordinator.scope
        state = scope.load_states().get(batch_id)
        runs = {r.get("run") for r in results}
        if state is None or (results and len(runs) != 1):
            raise CommitLogError(
                f"Spark asked to commit batch {batch_id}, but the commit log has no run of it "
                f"that these {len(results)} task results belong to (runs {sorted(map(str, runs))})",
                sink=scope.name, batch_id=batch_id,
                fix="run one query per checkpointLocation; restart the query (it recovers "
                "first) and the batch is written again")
        run = next(iter(runs), None)
        if not results and state.decided is None and state.open_runs:
            run = state.open_runs[-1]  # a batch without partitions: decided empty
        batch = self._batch(batch_id, {}, metrics)
        if state.decided is not None or run is None:
            # Decided before (a restart, or Spark calling commit again): finish it.
            if state.needs_commit:
                batch.commit(state)
            metrics.outcome = "replayed"
            return
        if run not in state.begun:
            raise CommitLogError(
                f"the task results name run {run} of batch {batch_id}, which the commit log "
                "never began", sink=scope.name, batch_id=batch_id,
                fix="this is a bug; please report it with the commit log")
        metrics.run = run
        opened = Opened(state, int(run), {SINGLE: (0, self.max_partitions)}, {SINGLE: schema})
        participants = batch.accept(opened, [dict(r) for r in results])
        batch.decide(state, int(run), participants, opened.schemas)
        batch.commit(state)
        self._abort_other_runs(batch_id, keep=int(run))

    def abort(self, batch_id: int, results: Sequence[TaskResult | None]) -> None:
        """Spark gave up on the batch (a task failed for good): roll back its runs that
        have no outcome. A decided run is never touched (the next commit or recovery
        finishes it)."""
        if self.config.guarantee is not Guarantee.EXACTLY_ONCE:
            return
        try:
            self._abort_other_runs(batch_id, keep=None, cause="Spark aborted the batch's "
                                   "write (a task failed with no retries left, or the query "
                                   "stopped)")
        finally:
            self.release_lease(batch_id)

    def _abort_other_runs(self, batch_id: int, keep: int | None,
                          cause: str = "another run of the batch was decided") -> None:
        state = self.coordinator.scope.load_states().get(batch_id)
        if state is None:
            return
        for run in state.open_runs:
            if run != keep:
                self.coordinator.recovery.abort_run(state, run, RuntimeError(cause))

    def _batch(self, batch_id: int, runners: dict[str, Any],
               metrics: BatchMetrics) -> ExactlyOnceBatch:
        c = self.coordinator
        return ExactlyOnceBatch(c.scope, c.checks, c.recovery, batch_id, runners, metrics,
                                check_participants=False)


def run_task(planned: PlannedBatch, partition: int, attempt_number: int, token: str,
             batches: Iterator[pa.RecordBatch],
             local_property: Callable[[str], str | None]) -> TaskResult:
    """Phase 1 of one task attempt, from the plan: a batch decided before writes
    nothing; a task of another batch or query than planned refuses (fail closed)."""
    from sparkeos.core.snapshot.tasks import TaskAttempt

    from .spark import QUERY_ID_PROPERTY

    running = local_property(BATCH_ID_PROPERTY)
    query = local_property(QUERY_ID_PROPERTY)
    if isinstance(planned.task, DirectTask) and running is not None:
        # At-least-once needs no plan of the batch: the task's own batch ID, and the
        # running query's identity (the planning's, if it had one, must agree).
        planned_identity = identity.QueryIdentity(planned.query_id, "the checkpointLocation "
                                                  "option's metadata")
        task_identity = planned_identity.agrees_with(identity.of_task(query))
        pool = task_identity.pool(planned.task.pool.sink)
        planned = dataclasses.replace(
            planned, batch_id=int(running), query_id=task_identity.query_id,
            task=dataclasses.replace(planned.task, batch_id=int(running), pool=pool))
    if running is None or int(running) != planned.batch_id or (
            planned.run is not None and query != planned.query_id):
        raise CommitLogError(
            f"a task of batch {running} (query {query}) ran with the plan of batch "
            f"{planned.batch_id} (query {planned.query_id}): the batch read from the "
            "checkpoint's offsets log is not the one Spark runs; this task wrote nothing",
            batch_id=planned.batch_id,
            fix="run one query per checkpointLocation, with the checkpointLocation given as "
            "an option of the sparkeos format; please report it if that holds")
    if planned.task is None:
        rows = sum(batch.num_rows for batch in batches)  # run the plan (state stores)
        return {"partition": partition, "run": None, "rows": 0, "skipped_rows": rows}
    if partition >= planned.max_partitions:
        raise ConfigurationError(
            f"batch {planned.batch_id} has a partition {partition}, above the "
            f"{planned.max_partitions} partitions its transaction IDs were recorded for; "
            "this task wrote nothing",
            batch_id=planned.batch_id,
            fix="set the format's option sparkeos.maxPartitions above the query's "
            "partition count (spark.sql.shuffle.partitions, or the source's partitions), "
            "or repartition the stream; the batch is re-run, nothing is lost")
    attempt = TaskAttempt(partition, attempt_number, token)
    with planned.lease.renewing() if planned.lease else contextlib.nullcontext():
        result = planned.task(attempt, batches)
    return {**result, "run": planned.run}


def _bound(sink: TransactionalSink[Any], location: str, name: str) -> TransactionalSink[Any]:
    """``for_checkpoint``, once per process and sink (see ``SinkFormat``)."""
    key = (id(sink), location, name)
    held = _BOUND.get(key)
    if held is None or held[0] is not sink:
        bound = for_checkpoint(sink, location, name)
        assert isinstance(bound, TransactionalSink)
        held = _BOUND[key] = (sink, bound)
    return held[1]


_BOUND: dict[tuple[int, str, str], tuple[TransactionalSink[Any], TransactionalSink[Any]]] = {}
_PLANNED_DIRECT: dict[tuple[str, str, str], int] = {}
"""(checkpoint, query, sink) -> the last batch this process planned at-least-once: a
batch planned again is a replay, whose leftovers are swept first."""
MANY_PARTITIONS = 64
"""Above this many partitions in a batch the route warns (once per sink and process)."""
_WARNED: set[str] = set()


def warn_many_partitions(fields: dict[str, Any], partitions: int) -> None:
    """Spark runs a Python writer task per partition of a batch, at about 30 ms each on
    this route before a sink writes anything (measured with a Python sink that writes
    nothing: 6.2 s per batch at 200 partitions on 2 cores); the route cannot merge
    them, ``foreachBatch`` and a coalesced stream can."""
    if partitions <= MANY_PARTITIONS or fields["sink"] in _WARNED:
        return
    _WARNED.add(fields["sink"])
    log_event("format.many_partitions", logging.WARNING, **fields, partitions=partitions,
              fix="coalesce the stream before writeStream (e.g. .coalesce(4)), lower "
              "spark.sql.shuffle.partitions, or write through "
              "foreachBatch(exactly_once(...)), which coalesces to `writers`")


BATCH_ID_PROPERTY = "streaming.sql.batchId"
"""The local property Spark sets on the jobs of a micro-batch."""


def crash_whole_job(plan: FaultPlan) -> FaultPlan:
    """The fault plan of the format route: its steps run in Spark's Python workers, so a
    driver crash there kills the driver's process group (a job started in a session of
    its own, as the tests and examples start theirs), not only this worker."""
    if plan.point is None or plan.kill_group:
        return plan
    return dataclasses.replace(plan, kill_group=driver_group())


def resolve_checkpoint(config: CoordinatorConfig) -> str:
    """The checkpoint as Spark resolves it: the option exactly as written arrives, so
    a relative local path is made absolute here (the planning and commit workers run
    in the driver's directory)."""
    location = require_durable_checkpoint(config.checkpoint_location, config.name)
    if "://" not in location and not location.startswith("file:"):
        location = os.path.abspath(location)
    return location


def planned_batch(checkpoint: str) -> int:
    """The batch Spark is planning: the latest entry of ``<checkpoint>/offsets`` (Spark
    writes it before it plans the batch, and a restart runs that batch again)."""
    files, root = split_uri(checkpoint)
    offsets = f"{root.rstrip('/')}/offsets"
    try:
        names = files.listdir(offsets)
    except FileNotFoundError:
        names = []
    batches = [int(n) for n in names if n.isdigit()]
    if not batches:
        raise CommitLogError(
            f"Spark's offsets log {files.uri(offsets)} has no entry while a batch is being "
            "planned", fix="give the format the query's own checkpointLocation")
    return max(batches)


class _Planned:
    """The batch runner of the planning side: the plan's upper bound and the schema;
    what a runner would run in tasks runs in this process (recovery's phase 2, as
    ``sparkeos recover`` does), and phase 1 belongs to the writer's tasks."""

    def __init__(self, partitions: int, schema: pa.Schema) -> None:
        self._partitions, self._schema = partitions, schema

    def partitions(self) -> int:
        return self._partitions

    def arrow_schema(self) -> pa.Schema:
        return self._schema

    def run_tasks(self, task: Any) -> list[TaskResult]:
        raise AssertionError("phase 1 of the format route runs in the writer's tasks")

    def run_in_tasks(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        return [fn(item) for item in items]

    def run_without_output(self) -> None:
        """The writer's tasks run the plan and write nothing."""
