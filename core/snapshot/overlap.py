"""Phase 2 of a decided batch running beside the next batch's phase 1.

Once ``decided(N)`` is durable, finishing batch N is recovery's job after any crash, so
the query need not wait for it: with ``overlap_commits`` the coordinator returns to
Spark at the decision and commits batch N in the background, while batch N+1 prepares
on the pool's other slot. At most one batch is in flight:

* batch N+1's phase 2 starts only after batch N's ended (records become visible in
  batch order, and N+1's commits never race N's);
* a batch whose slot an in-flight batch holds (N+2, with nothing in between that
  waited) waits for it before anything else;
* a failure of the background phase 2 is kept and raised by the next batch: the query
  stops with it, whoever else saw it first. The batch stays decided, so nothing is
  lost: the next recovery commits it.
* the end of the query, of Spark's context or of the interpreter (and
  ``processAllAvailable``) waits for the batch in flight, from another thread than the
  query's (``core.streaming.ending``): two waits of one batch are safe. Such a wait
  raises the failure once, to whichever of them asks first, and leaves it for the
  query's next batch, which must not commit past it.

How the background runs is pluggable (``Starter``): a thread in production, an actor
of the model check's scheduler there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol


class Running(Protocol):
    """What a ``Starter`` returns for the work it started."""

    def done(self) -> bool: ...

    def wait(self) -> None: ...

    def is_current(self) -> bool:
        """Whether the caller runs inside this work."""
        ...


Starter = Callable[[str, Callable[[], None]], Running]
"""Start ``work`` (named ``name``) beside the caller; return a handle to await it."""


class _Thread:
    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread

    def done(self) -> bool:
        return not self.thread.is_alive()

    def wait(self) -> None:
        self.thread.join()

    def is_current(self) -> bool:
        return self.thread is threading.current_thread()


def start_thread(name: str, work: Callable[[], None]) -> Running:
    # Not a daemon: a driver whose query ended finishes the commit before it exits.
    thread = threading.Thread(target=work, name=name, daemon=False)
    thread.start()
    return _Thread(thread)


class CommitsInFlight:
    """The phase 2 a coordinator runs in the background: at most one batch's."""

    def __init__(self, start: Starter = start_thread) -> None:
        self._start = start
        self._running: Running | None = None
        self.batch_id: int | None = None
        self.held: dict[str, int] = {}
        """The in-flight batch's participants per member: their transactions stay open
        until its phase 2 ends (a sink counts them with the next batch's)."""
        self._error: BaseException | None = None
        """The failure for the query's next batch: only that batch clears it."""
        self._unreported: BaseException | None = None
        """The same failure, until a wait from outside the query raised it."""
        self._lock = threading.Lock()
        """Held to forget the batch that ended, never while waiting."""

    @property
    def busy(self) -> frozenset[int]:
        """The batch whose phase 2 may still be running (recovery leaves it alone)."""
        return frozenset() if self.batch_id is None else frozenset({self.batch_id})

    def start(self, batch_id: int, work: Callable[[], None], name: str,
              held: dict[str, int]) -> None:
        """Run ``work`` (batch ``batch_id``'s phase 2) in the background; the caller
        waited for the one before (``wait``)."""
        assert self._running is None, "one batch in flight at most"
        self.held = held

        def guarded() -> None:
            try:
                work()
            except BaseException as exc:  # kept for the next batch: never lost
                with self._lock:
                    self._error = self._unreported = exc

        self.batch_id = batch_id
        self._running = self._start(name, guarded)

    def wait(self, *, for_the_query: bool = True) -> None:
        """Wait for the batch in flight; raise its failure. ``for_the_query``: the
        query's own batch path asks, and the failure is then cleared; a wait from
        outside (``for_the_query=False``: an end of the query, ``flush``) raises it
        once and leaves it for the query's next batch."""
        running = self._running
        if running is not None:
            if running.is_current():
                # The commit thread itself (a metrics callback that flushes): it cannot
                # wait for its own end, and its batch is committed by then.
                return
            running.wait()
            self._forget(running)
        self.raise_failure(for_the_query=for_the_query)

    def raise_failure(self, *, for_the_query: bool = True) -> None:
        """Raise the failure of a phase 2 that already ended, if any (see ``wait``)."""
        running = self._running
        if running is not None:
            if not running.done():
                return
            self._forget(running)
        with self._lock:
            if for_the_query:
                error, self._error, self._unreported = self._error, None, None
            else:
                error, self._unreported = self._unreported, None
        if error is not None:
            raise error

    def _forget(self, running: Running) -> None:
        """``running`` ended: nothing in flight, unless a waiter on another thread
        already forgot it and the next batch started."""
        with self._lock:
            if self._running is running:
                self._running = None
                self.batch_id = None
                self.held = {}
