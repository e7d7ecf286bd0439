"""The format route's tasks keep their batch's lease while they run (``core.snapshot.lease``
is the driver's side): a task opens the log's store where it runs."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sparkeos.core.observe import log_event
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.lease import RENEWALS_PER_LIFETIME
from sparkeos.core.storage.logstores import is_local_uri, local_path, open_store

RENEWAL_JOIN_S = 10.0
"""How long the end of a task or commit waits for a renewal being written."""


@dataclass(frozen=True)
class TaskRenewal:
    """What the tasks of a format-route batch need to keep its lease while they run
    (pickled with the plan): where the log is and the record to write. A task renews
    once a tenth of the lifetime has passed since the planning, and every tenth after
    that, from a daemon thread, until it ends: short batches write nothing."""

    log_location: str
    record: dict[str, Any]
    planned_at: float

    @contextlib.contextmanager
    def renewing(self) -> Iterator[None]:
        stop = threading.Event()
        # In a copy of the task's context: the store locations its format carries.
        thread = threading.Thread(target=contextvars.copy_context().run,
                                  args=(self._run, stop), daemon=True,
                                  name="sparkeos-lease-task")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            # A renewal still being written when the task ends would land after the
            # batch's commit released the lease, and hold it (recover refusing) until it
            # expired: wait for it, but not for a store that hangs.
            thread.join(timeout=RENEWAL_JOIN_S)

    def _run(self, stop: threading.Event) -> None:
        ttl = float(self.record.get("ttl_s", 0))
        interval = ttl / RENEWALS_PER_LIFETIME
        if interval <= 0:
            return
        elapsed = max(0.0, time.time() - self.planned_at)
        while not stop.wait(max(0.0, interval - elapsed % interval)):
            elapsed = 0.0
            self._renew()

    def _renew(self) -> None:
        if is_local_uri(self.log_location) and not os.path.isdir(
                local_path(self.log_location)):
            return  # a local path of the driver's host: not this one
        try:
            CommitLog(open_store(self.log_location)).write_lease(
                {**self.record, "renewed": time.time()})
        except Exception as exc:  # the next renewal tries again
            log_event("lease.write_failed", logging.WARNING, log=self.log_location,
                      cause=str(exc))
