"""A query that ends, ends committed: the batch ``overlap_commits`` commits in the
background is committed, or its failure raised, when the query, Spark's context or the
interpreter ends (DESIGN.md section 9).

With ``overlap_commits`` Spark counts a batch done once it is decided, and its phase 2
runs on a driver thread (``core.snapshot.overlap``). Measured on pyspark 4.3 (classic, local):

* ``spark.stop()`` while that thread commits: its Spark job fails ("Cannot call methods
  on a stopped SparkContext"), and the batch stays decided and not committed.
* A ``StreamingQueryListener``'s ``onQueryTerminated`` runs on a py4j callback thread
  0.1-0.2 s after ``query.stop()`` or ``awaitTermination()`` returned. ``spark.stop()``
  stops Spark's scheduler before it drains the listener bus, so a listener that waits
  holds ``spark.stop()`` up but not the context: the commit's jobs fail all the same.
* ``query.stop()`` leaves the thread's jobs running (they are not in the query's job
  group). At the interpreter's exit Python joins the thread (it is no daemon) before it
  runs ``atexit`` and before the JVM ends with the process: the commit runs to its end.

So for every adapter with ``overlap_commits`` (``hold``), with no change to the user's
code:

* ``StreamingQuery.processAllAvailable()`` returns after what it processed is committed
  (or raises the failure of that commit), as without ``overlap_commits``;
* ``StreamingQuery.stop()`` and ``awaitTermination()`` (once the query ended) return
  after the adapters that served the query committed what it decided, or raise the
  failure of that commit (pyspark's classic class, wrapped once per process); an
  ``awaitTermination()`` that raises the query's own failure raises it at once;
* ``SparkContext.stop()`` (``spark.stop()``) waits for every adapter's commit (at most
  ``STOP_WAIT_S``: a commit whose tasks find no executor must not hold the stop for
  ever), stops the context, waits for a commit still running (Spark stopped under it:
  it finishes in this process, ``core.snapshot.recovery``), then raises the first failure;
  ``SparkSession.stop()`` raises it after pyspark's own clean-up of the session;
* at the interpreter's exit, a failure no one raised is logged as an error
  (``query.end_failed``) and printed, and the process exits with status 1
  (``EXIT_STATUS``; Python offers no other way to change it then than ``os._exit``,
  after the logs are flushed: ``atexit`` functions registered before this module's
  are not run).

Under Spark Connect the adapter runs in a Python process of the server: none of this is
in the client, and what its process does at a query's end is the server's (a decided
batch is committed by the next batch, or by ``sparkeos recover``).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import describe_cause
from sparkeos.core.observe import log_event


class Committing(Protocol):
    """What the ends of a query know of an adapter (``ForeachBatchAdapter``) that may
    have a batch committing in the background."""

    @property
    def name(self) -> str: ...

    def served(self, query_id: str) -> bool: ...

    def settle(self, query_id: str) -> None: ...

    def flush(self) -> None: ...

EXIT_STATUS = 1
"""The interpreter's exit status when a background commit failed and no one raised it."""
STOP_WAIT_S = float(os.environ.get("SPARKEOS_STOP_WAIT_SECONDS", "300"))
"""How long ``spark.stop()`` waits for background commits while Spark can still run
their tasks; past it, the context stops and they finish in this process."""
_WRAPPED = "__sparkeos_ending__"


def overlaps(config: CoordinatorConfig, connect: bool) -> bool:
    """Whether a foreachBatch query's batches commit in the background
    (``overlap_commits``): as set, and by default (None) where this module holds the
    end of the query, a classic session under exactly-once. Under Spark Connect it is
    off whatever was set (no hook reaches the server's process)."""
    return not connect and holds(config)


def holds(config: CoordinatorConfig) -> bool:
    """Whether an adapter of ``config`` may overlap, so that the ends of its queries
    must wait for it (``hold``): known before the session is (classic or Connect)."""
    return config.guarantee is Guarantee.EXACTLY_ONCE and config.overlap_commits is not False


def watch_ends() -> None:
    """Wrap the ends of pyspark's queries and sessions, once per process: before any
    query of an adapter that may overlap can end, or be waited for (a call that began
    before the wrap would not wait)."""
    with _LOCK:
        _wrap_pyspark()


def hold(adapter: Committing) -> None:
    """Make the end of each query ``adapter`` serves, of Spark's context and of the
    interpreter wait for its background commits (and raise their failures)."""
    with _LOCK:
        _ADAPTERS.add(adapter)
        _wrap_pyspark()


def after_query(query_id: str) -> None:
    """The query ``query_id`` ended: wait for what its adapters decided to be
    committed; raise the first failure (the others are logged)."""
    _in_turn([functools.partial(adapter.settle, query_id)
              for adapter in list(_ADAPTERS) if adapter.served(query_id)])


def before_context_stop() -> None:
    """Spark's context is about to stop: wait for every adapter's background commit;
    raise the first failure (the others are logged)."""
    _in_turn([adapter.flush for adapter in list(_ADAPTERS)])


def _in_turn(steps: list[Callable[[], None]]) -> None:
    """Run every step, whatever the one before raised; raise the first failure and log
    the others."""
    failures = []
    for step in steps:
        try:
            step()
        except BaseException as exc:
            failures.append(exc)
    for later in failures[1:]:
        log_event("query.end_failed", logging.ERROR, cause=describe_cause(later))
    if failures:
        raise failures[0]


def _wrap_pyspark() -> None:
    """Wrap pyspark's classic ``StreamingQuery.stop`` / ``awaitTermination`` /
    ``processAllAvailable``,
    ``SparkContext.stop`` and ``SparkSession.stop``, once per process."""
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
        from pyspark.sql.streaming.query import StreamingQuery
    except ImportError:
        return
    if getattr(SparkContext.stop, _WRAPPED, False):
        return
    _wrap(StreamingQuery, "stop", _query_stop)
    _wrap(StreamingQuery, "awaitTermination", _query_await)
    _wrap(StreamingQuery, "processAllAvailable", _query_processed)
    _wrap(SparkContext, "stop", _context_stop)
    _wrap(SparkSession, "stop", _session_stop)


def _wrap(cls: type, name: str, wrapper: Callable[..., Any]) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return wrapper(original, self, *args, **kwargs)

    setattr(method, _WRAPPED, True)
    setattr(cls, name, method)


def _query_stop(original: Callable[..., Any], query: Any) -> None:
    original(query)
    after_query(str(query.id))


def _query_processed(original: Callable[..., Any], query: Any) -> None:
    # The query goes on; what it processed is read next (tests, notebooks), so it must
    # be committed, as without overlap_commits.
    original(query)
    after_query(str(query.id))


def _query_await(original: Callable[..., Any], query: Any, *args: Any,
                 **kwargs: Any) -> Any:
    ended = original(query, *args, **kwargs)
    if ended is None or ended:  # no timeout, or the query ended within it
        after_query(str(query.id))
    return ended


def _context_stop(original: Callable[..., Any], context: Any) -> None:
    # After the stop: a commit still running, which Spark stopped under, ends in this
    # process (core.snapshot.recovery).
    waiting = _Bounded(before_context_stop)
    failure = _collect(_in_turn, [waiting.run, functools.partial(original, context),
                                  before_context_stop, waiting.finish])
    if failure is None:
        return
    deferred = getattr(_DEFERRING, "failures", None)
    if deferred is not None:  # SparkSession.stop raises it after its own clean-up
        deferred.append(failure)
        return
    raise failure


def _session_stop(original: Callable[..., Any], session: Any) -> None:
    """pyspark's ``SparkSession.stop`` stops the context first and clears the session
    after: a failure of the context's stop is raised once that is done."""
    _DEFERRING.failures = []
    try:
        original(session)
    finally:
        failures, _DEFERRING.failures = _DEFERRING.failures, None
    if failures:
        raise failures[0]


def _collect(run: Callable[[list[Callable[[], None]]], None],
             steps: list[Callable[[], None]]) -> BaseException | None:
    try:
        run(steps)
    except BaseException as exc:
        return exc
    return None


class _Bounded:
    """``step`` on a thread of its own, waited for at most ``STOP_WAIT_S`` (``run``);
    ``finish`` waits for it to end and raises its failure (nothing is lost if ``run``
    stopped waiting)."""

    def __init__(self, step: Callable[[], None]) -> None:
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._target, args=(step,), daemon=True,
                                       name="sparkeos-before-context-stop")

    def _target(self, step: Callable[[], None]) -> None:
        try:
            step()
        except BaseException as exc:
            self.failure = exc

    def run(self) -> None:
        self.thread.start()
        self.thread.join(STOP_WAIT_S)
        if self.thread.is_alive():
            log_event("query.end_waiting", logging.WARNING, seconds=STOP_WAIT_S,
                      detail="a background commit did not end while Spark's context "
                      "could still run its tasks: the context stops now, and the commit "
                      "ends in this process",
                      fix="raise SPARKEOS_STOP_WAIT_SECONDS, or stop the queries "
                      "(query.stop()) before the session")
        elif self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure

    def finish(self) -> None:
        self.thread.join()
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure


def _at_exit() -> None:
    """A failure of a background commit no one raised: logged, printed, and the
    interpreter exits with ``EXIT_STATUS``. Registered when this module is imported
    (with ``exactly_once``), so it runs after the ``atexit`` functions registered later;
    Python joined the commit threads before any of them."""
    failures: list[tuple[str, BaseException]] = []
    for adapter in list(_ADAPTERS):
        try:
            adapter.flush()
        except BaseException as exc:
            failures.append((adapter.name, exc))
    if not failures:
        return
    for name, failure in failures:
        log_event("query.end_failed", logging.ERROR, sink=name,
                  cause=describe_cause(failure),
                  fix="restart the query or run `sparkeos recover <checkpointLocation>`: "
                  "a decided batch is committed first")
        print(f"sparkeos: the query ended, but the background commit of sink {name!r} "
              f"failed and nothing raised it:\n{failure}", file=sys.stderr)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_STATUS)


_LOCK = threading.Lock()
_ADAPTERS: weakref.WeakSet[Committing] = weakref.WeakSet()
"""Every adapter of this process that overlapped a batch or finished a query's start.
Weakly: an adapter with a commit running is kept alive by its commit thread (the
metrics callback is the adapter's), one whose query is active by that query's batch
function (py4j holds it); one that nothing holds has nothing left to wait for."""
_DEFERRING = threading.local()
"""In ``SparkSession.stop``: the failures of the context's stop, raised after it."""
atexit.register(_at_exit)
