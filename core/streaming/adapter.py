"""The one-line foreachBatch adapter: ``.foreachBatch(exactly_once(sink, name=...))``.

Per batch it only finds which query run it is in: everything settled once per run
(checkpoint, commit log, lease, shared paths, the coordinator) is a ``QueryRun``. The
batch's DataFrame becomes one ``SparkBatchRunner`` per member and goes to the
coordinator.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import ConfigurationError, describe_cause
from sparkeos.core.observe import BatchMetrics, log_event
from sparkeos.core.protocol import TransactionalSink
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.group import SinkGroup

from . import ending, onstart
from .queryrun import _NAME_CLAIMS as _NAME_CLAIMS  # re-exported: tests reset it
from .queryrun import QueryRun, claim_log
from .queryrun import claim_sink_name as claim_sink_name
from .spark import SparkBatchRunner, running_query
from .sparkversion import check_pyspark

MetricsCallback = Callable[[BatchMetrics], None]
Frame = Callable[[Any], Any]
"""A member's DataFrame, from the batch's: ``lambda df: df.select(...)``."""
SinkSpec = TransactionalSink[Any] | SinkGroup | Mapping[
    str, TransactionalSink[Any] | tuple[TransactionalSink[Any], Frame]]
"""A sink; or several, by member name, each optionally with its own DataFrame."""


class ForeachBatchAdapter:
    """A callable for ``DataStreamWriter.foreachBatch`` that runs the protocol.

    ``metrics`` holds the last 100 ``BatchMetrics``; ``on_batch`` is called with each.
    """

    def __init__(
        self,
        sink: SinkSpec,
        config: CoordinatorConfig,
        on_batch: MetricsCallback | None = None,
    ) -> None:
        check_pyspark()
        self.sink, self.frames = _resolve(sink, config.name)
        self.config = config
        self.on_batch = on_batch
        self.metrics: deque[BatchMetrics] = deque(maxlen=100)
        self._run: QueryRun | None = None
        self._token = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._finishing: dict[str, onstart.Finishing] = {}
        self._finishing_lock = threading.Lock()
        if ending.holds(config):
            # Before the query starts: a stop() or awaitTermination() called then must
            # wait for the commit too.
            ending.watch_ends()
            # A restart without new input runs no batch: finish at the start instead.
            onstart.watch(self)

    def __getstate__(self) -> dict[str, Any]:
        # Spark Connect cloudpickles the foreachBatch function to a server-side Python
        # process: ship the configuration, not the lock or the query run of this process
        # (its commit log, lease and coordinator are rebuilt, with recovery, on the
        # first batch there).
        state = dict(self.__dict__)
        for transient in ("_lock", "_run", "_finishing", "_finishing_lock"):
            state.pop(transient, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if ending.holds(self.config):
            ending.watch_ends()  # as __init__ does: before a query of this copy can end
        self._lock = threading.Lock()
        self._run = None
        self._finishing = {}
        self._finishing_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def last_metrics(self) -> BatchMetrics | None:
        return self.metrics[-1] if self.metrics else None

    def __call__(self, df: Any, batch_id: int) -> None:
        check_pyspark()  # where the batch runs: Spark Connect's server has its own pyspark
        with self._lock:
            coordinator = self._coordinator_for(df)
            runners = {member: SparkBatchRunner(self.frames[member](df) if member in self.frames
                                                else df, part.cluster_by(),
                                                writers=self.config.writers,
                                                columns=part.task_columns())
                       for member, part in coordinator.members.items()}
            coordinator.run_batch(int(batch_id), runners, on_complete=self._completed)

    def flush(self) -> None:
        """Wait until every batch Spark saw end is committed (with ``overlap_commits``
        the last one may still be committing in the background); raise the failure of
        its commit. Without ``overlap_commits`` there is never anything to wait for.
        It also waits for what a query's start commits (``core.streaming.onstart``). The end of a
        query, of Spark's context and of the interpreter call it (``core.streaming.ending``)."""
        self.settle(None)

    def served(self, query_id: str) -> bool:
        """Whether this adapter runs, or ran last, the query ``query_id`` (or commits
        what its start left decided)."""
        run = self._run
        return (run is not None and run.key[0] == query_id) or query_id in self._finishing

    def settle(self, query_id: str | None) -> None:
        """``flush`` for the query ``query_id`` (None: any query): the first failure is
        raised, the others logged."""
        failure = self._await_finishing(query_id)
        run = self._run
        if (run is not None and run.coordinator is not None
                and query_id in (None, run.key[0])):
            try:
                run.coordinator.flush()
            except BaseException:
                if failure is not None:
                    _log_dropped(self.name, failure)
                raise
        if failure is not None:
            raise failure

    def query_started(self, session: Any, query_id: str) -> None:
        """A query of the session started (``core.streaming.onstart``): commit what a crash left
        decided in this sink's log under its checkpoint, before its first batch."""
        with self._finishing_lock:
            for done in [q for q, f in self._finishing.items() if f.succeeded]:
                del self._finishing[done]  # other queries' starts: nothing to keep
            if query_id not in self._finishing:
                ending.hold(self)  # the end of the query waits for what its start commits
                self._finishing[query_id] = onstart.Finishing(session, self.sink,
                                                              self.config, query_id)

    def _await_finishing(self, query_id: str | None) -> BaseException | None:
        """Wait for the start of ``query_id`` (None: of every query) to be finished;
        its failure, if any."""
        # Not forgotten here: a query still running (processAllAvailable) has its first
        # batch wait for the same thread; query_started drops the ones that succeeded.
        with self._finishing_lock:
            finishing = [f for q, f in self._finishing.items()
                         if query_id is None or q == query_id]
        failures = [f for f in (one.wait() for one in finishing) if f is not None]
        for later in failures[1:]:
            _log_dropped(self.name, later)
        return failures[0] if failures else None

    def _completed(self, metrics: BatchMetrics) -> None:
        """A batch's records are committed (or it needed no commit)."""
        self.metrics.append(metrics)
        if self.on_batch is not None:
            self.on_batch(metrics)

    def _coordinator_for(self, df: Any) -> Coordinator:
        """The coordinator of the query run ``df`` belongs to: the one opened at its
        first batch, or (a new query run, or the first batch) a new one."""
        key = running_query(df)
        run = self._run
        if run is not None and run.coordinator is not None and key == run.key:
            return run.coordinator
        if run is not None and run.coordinator is not None:
            # A new run of the query in this process: the old run's background commit
            # ends first (its failure is left to the new run's recovery, which commits
            # the decided batch again).
            try:
                run.coordinator.flush()
            except Exception:
                pass
        if key[0] is not None:
            # Its failure is the new run's recovery's to meet again (and raise).
            self._await_finishing(key[0])
        self._run = QueryRun(key, lease=run.lease if run is not None else None)
        coordinator = self._run.open(df, self.sink, self.config, self._token)
        if coordinator.config.overlap_commits:
            # The end of the query, of Spark or of the interpreter waits for the commit.
            # Held from the first batch that may overlap, not from construction: an
            # adapter that never runs one (under Spark Connect, the client's) is no
            # end's concern.
            ending.hold(self)
        return coordinator

    def _claim_log(self, log: CommitLog, query_identity: str,
                   bound: TransactionalSink[Any] | SinkGroup | None = None) -> str:
        """``claim_log`` for this adapter's sink (bound to a checkpoint, if given)."""
        return claim_log(log, query_identity, bound if bound is not None else self.sink,
                         self.name)


def _log_dropped(sink: str, failure: BaseException) -> None:
    """A failure raised beside another one, which is raised instead."""
    log_event("query.end_failed", logging.ERROR, sink=sink, cause=describe_cause(failure),
              fix="restart the query or run `sparkeos recover <checkpointLocation>`: a "
              "decided batch is committed first")


def _resolve(sink: SinkSpec, name: str) -> tuple[TransactionalSink[Any] | SinkGroup,
                                                  dict[str, Frame]]:
    if isinstance(sink, (TransactionalSink, SinkGroup)):
        return sink, {}
    if not isinstance(sink, Mapping):
        raise ConfigurationError(
            f"exactly_once() got a {type(sink).__name__}, not a sink", sink=name,
            fix="pass a sparkeos sink, or a dict of them: {'db': PostgresSink(...), "
            "'events': (KafkaSink(...), lambda df: df.select(...))}")
    members: dict[str, TransactionalSink[Any]] = {}
    frames: dict[str, Frame] = {}
    for member, entry in sink.items():
        if isinstance(entry, tuple):
            if len(entry) != 2 or not callable(entry[1]):
                raise ConfigurationError(
                    f"member {member!r}: give a sink or a pair (sink, function)", sink=name,
                    fix=f"'{member}': (KafkaSink(...), lambda df: df.select(...))")
            members[member], frames[member] = entry
        else:
            members[member] = entry
    return SinkGroup(members), frames


def with_guarantee(
    sink: SinkSpec,
    name: str,
    guarantee: Guarantee | str,
    *,
    checkpoint_location: str | None = None,
    on_batch: MetricsCallback | None = None,
    **settings: Any,
) -> ForeachBatchAdapter:
    config = CoordinatorConfig(
        name=name,
        guarantee=Guarantee.parse(guarantee),
        checkpoint_location=checkpoint_location,
        **settings,
    )
    return ForeachBatchAdapter(sink, config, on_batch)


def exactly_once(
    sink: SinkSpec,
    name: str,
    *,
    checkpoint_location: str | None = None,
    on_batch: MetricsCallback | None = None,
    **settings: Any,
) -> ForeachBatchAdapter:
    """Wrap ``sink`` for ``foreachBatch`` with the exactly-once guarantee.

    ``name`` identifies the sink within the query and must stay the same across
    restarts. Several sinks under one decision (a batch lands in all or, after
    recovery, none): ``exactly_once({"db": pg, "events": (kafka, to_events)}, name=...)``,
    where ``to_events`` maps the batch DataFrame to that member's; member names are
    recorded, keep them stable. The commit log goes to
    ``<checkpointLocation>/sparkeos/<name>/``; the query's checkpointLocation is found
    automatically, or give ``checkpoint_location``.
    """
    return with_guarantee(sink, name, Guarantee.EXACTLY_ONCE,
                          checkpoint_location=checkpoint_location, on_batch=on_batch,
                          **settings)


def at_least_once(
    sink: SinkSpec,
    name: str,
    *,
    on_batch: MetricsCallback | None = None,
    **settings: Any,
) -> ForeachBatchAdapter:
    """Each task commits its own transaction; a replayed batch is written again."""
    return with_guarantee(sink, name, Guarantee.AT_LEAST_ONCE, on_batch=on_batch, **settings)
