"""Files a test run makes once per machine (the class-data archive, the Spark home),
which two test sessions may want at the same moment (./run test runs two pytest
workers): one makes it, the other waits for it."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable


def made_once(path: str, make: Callable[[str], str | None]) -> str | None:
    """``path`` if it exists, else what ``make(path)`` returns (``path``, made whole,
    or None if it cannot be made), under a lock in its directory; None where the
    directory cannot be written."""
    if os.path.exists(path):
        return path
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(path):
                return path
            return make(path)
    except OSError:  # a read-only environment: the run goes on without it
        return None
