"""``$SPARKEOS_JOB_LOG``: a JSON line per Spark run of the test harness and per event
around it (a wait for a one-per-machine thing, a process started ahead and what became
of it): what a test run spends its time on."""

from __future__ import annotations

import json
import os

JOB_LOG_ENV = "SPARKEOS_JOB_LOG"
"""A file to which every run appends a JSON line (the test, where the run ran, its wall
time, its exit code): what a test run spends its time on."""


def log_time(kind: str, seconds: float, returncode: int = 0) -> None:
    """Append a line to ``$SPARKEOS_JOB_LOG`` (nothing without it)."""
    log = os.environ.get(JOB_LOG_ENV)
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", ""),
                                 "kind": kind, "seconds": round(seconds, 2),
                                 "returncode": returncode}) + "\n")


__all__ = ["JOB_LOG_ENV", "log_time"]
