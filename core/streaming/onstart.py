"""At a query's start, finish the batch a crash left committing in the background.

With ``overlap_commits`` Spark counts a batch done once it is decided (``core.snapshot.overlap``).
A crash during its background phase 2 leaves it decided and not committed. The
restarted query's first batch commits it before anything else, but a restart without
new input runs no batch (``availableNow`` ends at once, a processing-time trigger waits
for data), and the batch's records would stay invisible until one does.

So an adapter with ``overlap_commits`` watches the queries of its session start (a
``StreamingQueryListener``; classic sessions). At each start it commits the decided
batches of its sink's commit log under that query's checkpoint, on a driver thread, as
``sparkeos recover`` commits them. The query's first batch waits for that thread
before anything else; ``adapter.flush()`` waits for it and raises its failure.

Under Spark Connect the adapter runs in a Python process of the server, where no
listener sees the query start: the next batch, or ``sparkeos recover``, finishes it.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Protocol

from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import describe_cause
from sparkeos.core.faults import FaultPlan
from sparkeos.core.observe import log_event
from sparkeos.core.protocol import TransactionalSink
from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.group import SinkGroup, for_checkpoint
from sparkeos.core.storage.logstores import open_store
from sparkeos.core.storage.stores import settings as store_settings

from .spark import is_connect, is_temporary_checkpoint, query_checkpoint_in


class StartWatcher(Protocol):
    """What the start hook knows of an adapter (``ForeachBatchAdapter``): the sink's
    name, for logs, and the call it makes at each query start of the session."""

    @property
    def name(self) -> str: ...

    def query_started(self, session: Any, query_id: str) -> None: ...

AnySink = TransactionalSink[Any] | SinkGroup


def finish_decided(session: Any, sink: AnySink, config: CoordinatorConfig,
                   query_id: str) -> list[int]:
    """Commit the decided, unfinished batches of sink ``config.name`` of the query
    ``query_id``; the batches committed. A log that is not this sink's (another query,
    another destination under the same name) is left to its own."""
    try:
        location = config.checkpoint_location or query_checkpoint_in(session, query_id)
        if location is None or is_temporary_checkpoint(location):
            return []
        log = CommitLog(open_store(sink_log_location(location, config.name), session))
        meta = log.read_meta()
    except Exception as exc:
        # Every query of the session starts this, most of them not this sink's (other
        # stores, other formats): a log it cannot read is not known to be its own. If
        # it is, the query's first batch recovers it, as without this hook.
        log_event("onstart.not_checked", logging.INFO, sink=config.name, query=query_id,
                  cause=describe_cause(exc))
        return []
    if not meta or meta.get("query_id") != query_id:
        return []
    bound = for_checkpoint(sink, location, config.name)
    if (meta.get("sink_type") != bound.type_name
            or meta.get("identity") != bound.identity()):
        return []
    pending = sorted((s for s in log.batches().values() if s.needs_commit),
                     key=lambda s: s.batch_id)
    if not pending:
        return []
    coordinator = Coordinator(bound, config, log, str(meta["query_key"]), FaultPlan.from_env())
    for state in pending:
        coordinator.recovery.commit_decided(state, {}, recovering=True)
        log_event("onstart.committed", **coordinator.scope.fields(state.batch_id))
    return [s.batch_id for s in pending]


class Finishing:
    """One query start's finishing thread, and its failure."""

    def __init__(self, session: Any, sink: AnySink, config: CoordinatorConfig,
                 query_id: str) -> None:
        self.error: BaseException | None = None
        self.reported = False
        # A new thread has no active session to read the stores' settings from
        # (``fs.s3a.endpoint``...): they go with it (``core.storage.stores.settings``).
        locations = store_settings.captured_from(session)
        self.thread = threading.Thread(
            target=self._run, args=(session, sink, config, query_id, locations),
            daemon=False, name=f"sparkeos-onstart-{config.name}")
        self.thread.start()

    def _run(self, session: Any, sink: AnySink, config: CoordinatorConfig,
             query_id: str, locations: dict[str, str]) -> None:
        try:
            # One at a time per query and sink name in this process: adapters made for
            # the same query (a job that makes one per run) would commit one decided
            # batch side by side and fence each other; the later one finds it done.
            with _turn(query_id, config.name), store_settings.using(locations):
                finish_decided(session, sink, config, query_id)
        except BaseException as exc:
            self.error = exc
            log_event("onstart.commit_failed", logging.WARNING, sink=config.name,
                      query=query_id, cause=describe_cause(exc),
                      fix="the query's next batch commits it again, or run `sparkeos "
                      "recover <checkpointLocation>` once the destination is reachable")

    @property
    def succeeded(self) -> bool:
        return not self.thread.is_alive() and self.error is None

    def wait(self) -> BaseException | None:
        """Wait for the thread; its failure, to the first caller only (the next batch
        meets it again in its recovery)."""
        self.thread.join()
        with _LOCK:
            error, self.reported = (None if self.reported else self.error), True
        return error


def watch(adapter: StartWatcher) -> bool:
    """Tell ``adapter`` about every query its session starts from now on; False where
    that cannot be (no active session, Spark Connect)."""
    try:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
    except Exception:
        return False
    if session is None or is_connect(session):
        return False
    with _LOCK:
        entry = _LISTENERS.get(id(session))
        if entry is None or entry[0] is not session:
            listener = _start_listener(session)
            session.streams.addListener(listener)
            entry = _LISTENERS[id(session)] = (session, listener)
        entry[1].adapters.add(adapter)
    return True


def _start_listener(session: Any) -> Any:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class StartListener(StreamingQueryListener):  # type: ignore[misc]
        """Spark calls ``onQueryStarted`` before the query's first batch, in the thread
        that starts it: the adapters only start their threads there."""

        def __init__(self) -> None:
            self.adapters: weakref.WeakSet[StartWatcher] = weakref.WeakSet()

        def onQueryStarted(self, event: Any) -> None:
            for adapter in list(self.adapters):
                try:
                    adapter.query_started(session, str(event.id))
                except Exception as exc:  # a listener must not fail the query's start
                    log_event("onstart.failed", logging.WARNING, sink=adapter.name,
                              cause=describe_cause(exc))

        def onQueryProgress(self, event: Any) -> None:
            pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            # Called after query.stop() / awaitTermination() returned, and under
            # spark.stop() only once the context stopped: too late to commit what the
            # query decided. core.streaming.ending waits for it where the query ends.
            pass

    return StartListener()


def _turn(query_id: str, name: str) -> threading.Lock:
    with _LOCK:
        return _TURNS.setdefault((query_id, name), threading.Lock())


_LOCK = threading.Lock()
_TURNS: dict[tuple[str, str], threading.Lock] = {}
"""Per query and sink name: whose turn it is to finish a start (a lock per query run of
the process: a few bytes each)."""
_LISTENERS: dict[int, tuple[Any, Any]] = {}
"""One listener per session (kept with the session: an id is not reused while it is)."""
