"""One run of the streaming query, as one foreachBatch adapter sees it.

Everything that is settled once per query run lives here, not looked up per batch:
where the checkpoint is and which query it belongs to, the commit log and the claim of
its name, the shared-path check, the lease heartbeat, and the coordinator (whose first
batch recovers from the log). A new query run (a restart, in the same process or
another) opens a new one; a pickled adapter (Spark Connect ships it to a server-side
Python process) carries none of it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import CommitLogError, ConfigurationError, TransactionIdCollisionError
from sparkeos.core.faults import FaultPlan
from sparkeos.core.observe import log_event
from sparkeos.core.protocol import TransactionalSink
from sparkeos.core.snapshot.commitlog import IDENTITY_PINNED, CommitLog, sink_log_location
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.group import SinkGroup, for_checkpoint, members_of
from sparkeos.core.snapshot.lease import LeaseKeeper
from sparkeos.core.snapshot.txpool import query_key_for
from sparkeos.core.storage.fsutil import require_shared_on_executors
from sparkeos.core.storage.logstores import open_store

from . import ending, identity
from .spark import (
    default_writers,
    is_connect,
    is_temporary_checkpoint,
    query_activity,
    query_checkpoint,
    require_durable_checkpoint,
    run_in_tasks,
    runs_on_one_host,
)

RunKey = tuple[str | None, str | None]
"""(query id, run id) as Spark reports them to foreachBatch; (None, None) under Connect."""
AnySink = TransactionalSink[Any] | SinkGroup

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


class QueryRun:
    """The pieces of one query run: its key, its coordinator, the lease it keeps.

    ``lease`` starts as the lease the adapter held before (an earlier run's): taking
    this run's lease stops that one without releasing it."""

    def __init__(self, key: RunKey, lease: LeaseKeeper | None = None) -> None:
        self.key = key
        self.coordinator: Coordinator | None = None
        self.lease = lease

    def open(self, df: Any, sink: AnySink, config: CoordinatorConfig, token: str
             ) -> Coordinator:
        """Find the checkpoint, open and claim the commit log, check the shared paths,
        take the lease; then the coordinator (it recovers on its first batch)."""
        query_id, run_id = self.key
        faults = FaultPlan.from_env()
        connect = is_connect(df)
        if connect and config.overlap_commits:
            # The server ends the batch function's process when a query ends, under a
            # background commit, and no hook reaches it: the batch would stay decided.
            log_event("overlap.off_under_connect", logging.WARNING, sink=config.name,
                      detail="overlap_commits needs a classic session; under Spark "
                      "Connect each batch commits before it returns (the guarantee is "
                      "the same)")
        config = dataclasses.replace(config, overlap_commits=ending.overlaps(config, connect))
        if config.guarantee is not Guarantee.EXACTLY_ONCE:
            location = config.checkpoint_location or query_checkpoint(df, query_id)
            if location and not is_temporary_checkpoint(location):
                refuse_unfinished_log(location, config.name,
                                      None if connect else df.sparkSession)
            known = identity.of_foreach_batch(query_id, config.checkpoint_location)
            self.coordinator = Coordinator(sink, config, None, known.key, faults,
                                           durable_identity=known.durable)
            return self.coordinator
        location = checkpoint_of(df, config, query_id, connect)
        # The ID Spark keeps in the checkpoint is the one a running query reports: the
        # same query key in classic and Connect mode (core.streaming.identity).
        query = identity.of_foreach_batch(query_id, location).require(config.name)
        log_location = sink_log_location(location, config.name)
        # Under Connect there is no JVM in this process: the commit log is reached
        # from Python (local paths and HDFS; other URIs are refused by open_store).
        log = CommitLog(open_store(log_location, None if connect else df.sparkSession))
        claim_sink_name(run_id or query, log.location, token, config.name)
        bound = for_checkpoint(sink, location, config.name)
        check_shared_paths(df.sparkSession, bound, config)
        self.keep_lease(log, df, config, query)
        key = claim_log(log, query, bound, config.name)
        self.coordinator = Coordinator(bound, config, log, key, faults)
        return self.coordinator

    def keep_lease(self, log: CommitLog, df: Any, config: CoordinatorConfig,
                   query_id: str | None) -> None:
        """Tell operator commands the query is running (they refuse to act while the
        lease is fresh), from now until this query run ends: renewed from a thread,
        between batches and during long ones, released once the run is over."""
        run_id = self.key[1]
        if self.lease is not None:
            self.lease.stop(release=False)  # an earlier run of this adapter
        self.lease = LeaseKeeper(log, config.lease_ttl_s, query_id, run_id,
                                 query_activity(df, query_id, run_id))
        self.lease.start()


def refuse_unfinished_log(location: str, name: str, session: Any = None) -> None:
    """A query that moves to a weaker guarantee leaves its commit log alone, so what an
    exactly-once run of it left unresolved there (a batch decided and not committed, a
    run begun and not decided) would stay so, and the replay rule would later take the
    weaker run's commits of the batches after it for that batch's: refused, with the
    fix."""
    try:
        store = open_store(sink_log_location(location, name), session)
    except CommitLogError:
        return  # a store no commit log can be on: no exactly-once run wrote one there
    log = CommitLog(store)
    if log.read_meta() is None:
        return
    unresolved = sorted(s.batch_id for s in log.batches().values() if s.unresolved)
    if unresolved:
        raise ConfigurationError(
            f"the commit log at {log.location} holds batch(es) {unresolved} that an "
            "exactly-once run of this query left unresolved (decided and not committed, "
            "or begun and not decided); under a weaker guarantee nothing would finish "
            "them, and their rows could be lost",
            sink=name,
            fix="finish them first: run `sparkeos recover <checkpointLocation>`, or "
            "restart the query once under exactly_once; then switch; nothing was written")


def checkpoint_of(df: Any, config: CoordinatorConfig, query_id: str | None,
                  connect: bool) -> str:
    """The query's checkpoint: the one given, else the running query's (read from the
    JVM; Connect has none to read)."""
    if connect and config.checkpoint_location is None:
        raise ConfigurationError(
            "under Spark Connect the foreachBatch function cannot see the query's "
            "checkpointLocation (it runs in a server-side Python process)",
            sink=config.name,
            fix="pass the same path to exactly_once(..., checkpoint_location=...) "
            "as to .option('checkpointLocation', ...); nothing was written")
    return require_durable_checkpoint(
        config.checkpoint_location or query_checkpoint(df, query_id), config.name
    )


def check_shared_paths(session: Any, sink: AnySink, config: CoordinatorConfig) -> None:
    """On a cluster, before the run's first batch: every directory the sink needs
    shared is one for the driver and the executors (2 tasks per core, so every
    executor is likely to run one; each task checks again before it stages)."""
    paths = tuple(dict.fromkeys(
        path for part in members_of(sink).values() for path in part.shared_paths()))
    if not paths or runs_on_one_host(session):
        return
    require_shared_on_executors(lambda fn, items: run_in_tasks(session, fn, items),
                                paths, 2 * (config.writers or default_writers(session)),
                                config.name)


def claim_log(log: CommitLog, query_identity: str, sink: AnySink, name: str) -> str:
    """Check (or record) that this log belongs to this query and this destination.

    The destination (``identity()``) is pinned once a batch is decided; until then a
    changed destination is simply the new one (a first batch that failed against a
    wrong database must not bind the sink name to it), unless a run without an
    outcome may have left prepared state in the old one."""
    meta = log.read_meta()
    mine = {
        "query_id": query_identity,
        "query_key": query_key_for(query_identity),
        "sink_name": name,
        "sink_type": sink.type_name,
        "identity": sink.identity(),
    }
    if meta is None:
        log.write_meta({**mine, "description": sink.describe(),
                        "created": time.time()})
        return str(mine["query_key"])
    for field in ("query_id", "sink_type"):
        if meta.get(field) != mine[field]:
            raise _collision(name, log, field, meta.get(field), mine[field])
    changed = meta.get("description") != sink.describe()
    if meta.get("identity") != mine["identity"]:
        if meta.get(IDENTITY_PINNED) or any(s.open_runs for s in log.batches().values()):
            raise _collision(name, log, "identity", meta.get("identity"), mine["identity"])
        meta["identity"] = mine["identity"]  # nothing decided there yet: follow the fix
        changed = True
    if changed:
        meta["description"] = sink.describe()
        log.write_meta(meta)
    return str(meta["query_key"])


def _collision(name: str, log: CommitLog, field: str, recorded: Any,
               current: Any) -> TransactionIdCollisionError:
    return TransactionIdCollisionError(
        f"the commit log at {log.location} belongs to another "
        f"{field.replace('_', ' ')}: recorded {recorded!r}, this run has {current!r}; "
        "sharing it would mix two queries' transactions or destinations",
        sink=name,
        fix="give each query its own checkpointLocation and each sink of a query its "
        "own name; if the old query or destination is gone for good, run `sparkeos "
        "recover` with its old configuration and delete that directory",
    )
