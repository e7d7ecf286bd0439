"""The one-line foreachBatch adapter: ``.foreachBatch(exactly_once(sink, name=...))``."""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from .commitlog import IDENTITY_PINNED, CommitLog, open_store, sink_log_location
from .config import CoordinatorConfig, Guarantee
from .coordinator import Coordinator
from .errors import ConfigurationError, TransactionIdCollisionError
from .faults import FaultPlan
from .fsutil import require_shared_on_executors
from .group import SinkGroup, for_checkpoint, members_of
from .lease import LeaseKeeper
from .observe import BatchMetrics
from .protocol import TransactionalSink
from .spark import (
    SparkBatchRunner,
    checkpoint_query_id,
    default_writers,
    is_connect,
    query_activity,
    query_checkpoint,
    require_durable_checkpoint,
    run_in_tasks,
    running_query,
    runs_on_one_host,
)
from .txpool import query_key_for

MetricsCallback = Callable[[BatchMetrics], None]
Frame = Callable[[Any], Any]
"""A member's DataFrame, from the batch's: ``lambda df: df.select(...)``."""
SinkSpec = TransactionalSink[Any] | SinkGroup | Mapping[
    str, TransactionalSink[Any] | tuple[TransactionalSink[Any], Frame]]
"""A sink; or several, by member name, each optionally with its own DataFrame."""

_NAME_CLAIMS: dict[tuple[str, str], str] = {}
_NAME_CLAIMS_LOCK = threading.Lock()


def claim_sink_name(query_run: str, log_location: str, owner: str, sink: str) -> None:
    """Refuse a second adapter that writes the same commit log in the same query run.

    Two sinks given the same name in one query share one commit log: the second would
    find the first one's ``decided(N)`` and silently write nothing. ``owner`` is the
    adapter's own token; ``query_run`` is Spark's run ID (a restart is a new run)."""
    with _NAME_CLAIMS_LOCK:
        holder = _NAME_CLAIMS.setdefault((query_run, log_location), owner)
    if holder != owner:
        raise ConfigurationError(
            f"two sinks of this query are both named {sink!r}: they would share the commit "
            f"log at {log_location}, and the second would take the first one's batches for "
            "its own and write nothing",
            sink=sink,
            fix="give every exactly_once()/at_least_once() call of one query its own name= "
            "(e.g. 'orders-eu' and 'orders-us'); nothing of this sink was written",
        )


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
        self.sink, self.frames = _resolve(sink, config.name)
        self.config = config
        self.on_batch = on_batch
        self.metrics: deque[BatchMetrics] = deque(maxlen=100)
        self._coordinator: Coordinator | None = None
        self._run_key: tuple[str | None, str | None] | None = None
        self._lease: LeaseKeeper | None = None
        self._token = uuid.uuid4().hex
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Spark Connect cloudpickles the foreachBatch function to a server-side Python
        # process: ship the configuration, not the lock, the open commit log or the
        # coordinator of this process (it is rebuilt, with recovery, on the first batch).
        state = dict(self.__dict__)
        for transient in ("_lock", "_coordinator", "_run_key", "_lease"):
            state.pop(transient, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._coordinator = None
        self._run_key = None
        self._lease = None

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def last_metrics(self) -> BatchMetrics | None:
        return self.metrics[-1] if self.metrics else None

    def __call__(self, df: Any, batch_id: int) -> None:
        with self._lock:
            coordinator = self._coordinator_for(df)
            runners = {member: SparkBatchRunner(self.frames[member](df) if member in self.frames
                                                else df, part.cluster_by(),
                                                writers=self.config.writers,
                                                columns=part.task_columns())
                       for member, part in coordinator.members.items()}
            metrics = coordinator.run_batch(int(batch_id), runners)
        self.metrics.append(metrics)
        if self.on_batch is not None:
            self.on_batch(metrics)

    def _coordinator_for(self, df: Any) -> Coordinator:
        query_id, run_id = running_query(df)
        if self._coordinator is not None and (query_id, run_id) == self._run_key:
            return self._coordinator
        # A new query run (or the first batch): rebuild and recover from the log.
        self._run_key = (query_id, run_id)
        faults = FaultPlan.from_env()
        if self.config.guarantee is not Guarantee.EXACTLY_ONCE:
            key = query_key_for(query_id or f"adhoc:{self.name}")
            self._coordinator = Coordinator(self.sink, self.config, None, key, faults)
            return self._coordinator
        connect = is_connect(df)
        if connect and self.config.checkpoint_location is None:
            raise ConfigurationError(
                "under Spark Connect the foreachBatch function cannot see the query's "
                "checkpointLocation (it runs in a server-side Python process)",
                sink=self.name,
                fix="pass the same path to exactly_once(..., checkpoint_location=...) "
                "as to .option('checkpointLocation', ...); nothing was written")
        location = require_durable_checkpoint(
            self.config.checkpoint_location or query_checkpoint(df, query_id), self.name
        )
        # The ID Spark keeps in the checkpoint is the one a running query reports: the
        # same query key in classic and Connect mode.
        identity = query_id or checkpoint_query_id(location) or f"checkpoint:{location}"
        log_location = sink_log_location(location, self.name)
        # Under Connect there is no JVM in this process: the commit log is reached
        # from Python (local paths and HDFS; other URIs are refused by open_store).
        log = CommitLog(open_store(log_location, None if connect else df.sparkSession))
        claim_sink_name(run_id or identity, log.location, self._token, self.name)
        sink = for_checkpoint(self.sink, location, self.name)
        self._check_shared_paths(df.sparkSession, sink)
        self._keep_lease(log, df, identity, run_id)
        key = self._claim_log(log, identity, sink)
        self._coordinator = Coordinator(sink, self.config, log, key, faults)
        return self._coordinator

    def _check_shared_paths(self, session: Any, sink: TransactionalSink[Any] | SinkGroup
                            ) -> None:
        """On a cluster, before the run's first batch: every directory the sink needs
        shared is one for the driver and the executors (2 tasks per core, so every
        executor is likely to run one; each task checks again before it stages)."""
        paths = tuple(dict.fromkeys(
            path for part in members_of(sink).values() for path in part.shared_paths()))
        if not paths or runs_on_one_host(session):
            return
        require_shared_on_executors(lambda fn, items: run_in_tasks(session, fn, items),
                                    paths, 2 * (self.config.writers or default_writers(session)),
                                    self.name)

    def _keep_lease(self, log: CommitLog, df: Any, query_id: str | None,
                    run_id: str | None) -> None:
        """Tell operator commands the query is running (they refuse to act while the
        lease is fresh), from now until this query run ends: renewed from a thread,
        between batches and during long ones, released once the run is over."""
        if self._lease is not None:
            self._lease.stop(release=False)  # an earlier run of this adapter
        self._lease = LeaseKeeper(log, self.config.lease_ttl_s, query_id, run_id,
                                  query_activity(df, query_id, run_id))
        self._lease.start()

    def _claim_log(self, log: CommitLog, query_identity: str,
                   bound: TransactionalSink[Any] | SinkGroup | None = None) -> str:
        """Check (or record) that this log belongs to this query and this destination.

        The destination (``identity()``) is pinned once a batch is decided; until then a
        changed destination is simply the new one (a first batch that failed against a
        wrong database must not bind the sink name to it), unless a run without an
        outcome may have left prepared state in the old one."""
        sink = bound if bound is not None else self.sink
        meta = log.read_meta()
        mine = {
            "query_id": query_identity,
            "query_key": query_key_for(query_identity),
            "sink_name": self.name,
            "sink_type": sink.type_name,
            "identity": sink.identity(),
        }
        if meta is None:
            log.write_meta({**mine, "description": sink.describe(),
                            "created": time.time()})
            return str(mine["query_key"])
        for field in ("query_id", "sink_type"):
            if meta.get(field) != mine[field]:
                raise self._collision(log, field, meta.get(field), mine[field])
        changed = meta.get("description") != sink.describe()
        if meta.get("identity") != mine["identity"]:
            if meta.get(IDENTITY_PINNED) or any(s.open_runs for s in log.batches().values()):
                raise self._collision(log, "identity", meta.get("identity"), mine["identity"])
            meta["identity"] = mine["identity"]  # nothing decided there yet: follow the fix
            changed = True
        if changed:
            meta["description"] = sink.describe()
            log.write_meta(meta)
        return str(meta["query_key"])

    def _collision(self, log: CommitLog, field: str, recorded: Any,
                   current: Any) -> TransactionIdCollisionError:
        return TransactionIdCollisionError(
            f"the commit log at {log.location} belongs to another "
            f"{field.replace('_', ' ')}: recorded {recorded!r}, this run has {current!r}; "
            "sharing it would mix two queries' transactions or destinations",
            sink=self.name,
            fix="give each query its own checkpointLocation and each sink of a query its "
            "own name; if the old query or destination is gone for good, run `sparkeos "
            "recover` with its old configuration and delete that directory",
        )


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
