"""The running query's lease on its commit log: operator commands (``sparkeos recover``
without ``--force``) refuse to act while it is fresh.

A lease renewed only when a batch starts goes stale during a batch, or an idle spell,
longer than its lifetime, and ``recover`` would then abort the batch being written. So a
``LeaseKeeper`` renews it from a daemon thread of the process that runs the batches,
every tenth of its lifetime, for as long as the query run is active; once the query
stops it writes the lease released, and ``recover`` may act at once.

The format route has no process that lives as long as the query run, only Spark's
workers, which come and go. There the lease is held from the planning of a batch until
its commit ends: written before ``begun``, renewed by the batch's tasks
(``core.streaming.tasklease``) and by its commit while they run, released when the batch is
committed or aborted. Between two batches nothing is open, and ``recover`` checks the
lease after it read the log (``Coordinator.recover(guard=...)``): a run it finds open
was begun after its lease was written, so it is refused, never aborted. The record names
the driver's JVM (``driver_pid``), not a worker: a worker Spark reaps is no sign that the
query is gone.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from sparkeos.core.observe import log_event

from .commitlog import CommitLog

RENEWALS_PER_LIFETIME = 10


def lease_record(query_id: str | None, run_id: str | None, ttl_s: float, *,
                 released: bool = False, pid: int | None = None, host: str | None = None,
                 batch: int | None = None) -> dict[str, Any]:
    """``pid`` and ``host``: the process whose life is the query run's (default: this
    one); ``batch``: the batch that holds it (the format route)."""
    return {"query_id": query_id, "run_id": run_id, "host": host or socket.gethostname(),
            "pid": os.getpid() if pid is None else pid, "renewed": time.time(),
            "ttl_s": ttl_s, **({"batch": batch} if batch is not None else {}),
            **({"released": True} if released else {})}


def driver_pid() -> int:
    """The driver's JVM, from one of Spark's Python workers on the driver's host (the
    nearest ancestor running ``java``); this process's parent where none is found."""
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/comm") as fh:
                if fh.read().strip() == "java":
                    return pid
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return os.getppid()


def lease_held(lease: dict[str, Any] | None, now: float | None = None) -> bool:
    """Is a lease (as read from the log) held now: not released and not expired?"""
    if not lease or lease.get("released"):
        return False
    age = (time.time() if now is None else now) - float(lease.get("renewed", 0))
    return age <= float(lease.get("ttl_s", 0))


class LeaseKeeper:
    """Renews ``log``'s lease every ``ttl_s / 10`` while ``is_active()`` says the query
    run goes on (None: for as long as this process lives). ``is_active`` answering with
    an error counts as active: a lease kept too long only makes ``recover`` wait (or ask
    for ``--force``); one dropped too early lets it abort a live batch."""

    def __init__(self, log: CommitLog, ttl_s: float, query_id: str | None,
                 run_id: str | None, is_active: Callable[[], bool] | None = None) -> None:
        self.log, self.ttl_s = log, ttl_s
        self.query_id, self.run_id = query_id, run_id
        self.is_active = is_active
        self.renewals = 0
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Take the lease now, then keep it from a daemon thread."""
        self.renew()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"sparkeos-lease-{self.log.location}")
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.ttl_s)
        if release:
            self._write(released=True)

    def renew(self) -> None:
        self._write(released=False)
        self.renewals += 1

    def _write(self, *, released: bool) -> None:
        try:
            self.log.write_lease(lease_record(self.query_id, self.run_id, self.ttl_s,
                                              released=released))
        except Exception as exc:  # the next renewal tries again
            log_event("lease.write_failed", logging.WARNING, log=self.log.location,
                      cause=str(exc))

    def _active(self) -> bool:
        if self.is_active is None:
            return True
        try:
            return bool(self.is_active())
        except Exception:
            return True

    def _run(self) -> None:
        interval = self.ttl_s / RENEWALS_PER_LIFETIME
        while not self._stopped.wait(interval):
            if not self._active():
                self._stopped.set()
                self._write(released=True)
                log_event("lease.released", log=self.log.location, query=self.query_id,
                          run=self.run_id)
                return
            self.renew()


__all__ = ["LeaseKeeper", "driver_pid", "lease_held", "lease_record"]
