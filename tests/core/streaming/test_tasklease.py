"""A format-route task's lease renewals end with the task: none lands after it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.lease import lease_record
from sparkeos.core.streaming.tasklease import TaskRenewal


def test_a_renewal_being_written_when_the_task_ends_lands_before_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch's commit releases the lease right after its tasks (and its own
    renewing commit) end: a renewal still being written then would land after the
    release and hold the lease until it expired (``sparkeos recover`` refusing)."""
    order: list[str] = []
    writing, proceed = threading.Event(), threading.Event()
    write_lease = CommitLog.write_lease

    def slow_write(self: CommitLog, record: dict[str, Any]) -> None:
        writing.set()
        assert proceed.wait(30), "the test never let the renewal finish"
        write_lease(self, record)
        order.append("renewed")

    monkeypatch.setattr(CommitLog, "write_lease", slow_write)
    log_location = str(tmp_path / "log")
    (tmp_path / "log").mkdir()
    record = lease_record("q", None, ttl_s=0.5, batch=3)
    with TaskRenewal(log_location, record, planned_at=time.time() - 1).renewing():
        assert writing.wait(30), "no renewal started"
        proceed.set()  # the renewal finishes while the task ends
    order.append("ended")
    assert order == ["renewed", "ended"]
