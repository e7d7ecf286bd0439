"""Named steps inside a connector's commit, where tests interleave two committers.

Two processes may commit the same decided transaction at once: the driver's phase 2
and ``sparkeos recover --force``, a second driver, a call retried after a timeout that
went through. Each step of a commit must be safe against such a twin. A connector marks
the moments between its steps with ``commit_step("name", txn)`` and lists the names in
its class attribute ``commit_steps``; the conformance suite then pauses one committer at
each step while the other runs, for every pair of steps (``sparkeos.testing.
interleave``), and checks that every row lands once and neither twin fails.

In production no hook is installed and a step costs one global read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

StepHook = Callable[[str, Any], None]
TRACE_ENV = "SPARKEOS_STEP_TRACE"
"""A file this process appends the name of every step it reaches to (tests that race
another process, e.g. ``sparkeos recover``, watch it)."""
COMMIT = "commit"
"""The step the coordinator reaches before it calls a sink's ``commit``."""


def _tracer(path: str) -> StepHook:
    def trace(name: str, txn: Any) -> None:
        with open(path, "a") as fh:
            fh.write(f"{name}\n")

    return trace


_hook: StepHook | None = _tracer(os.environ[TRACE_ENV]) if os.environ.get(TRACE_ENV) else None


def commit_step(name: str, txn: Any) -> None:
    """The committer of ``txn`` reached step ``name`` (declared in ``commit_steps``)."""
    hook = _hook
    if hook is not None:
        hook(name, txn)


def install(hook: StepHook | None) -> StepHook | None:
    """Install ``hook`` for every thread of this process (tests only); returns the one
    it replaces."""
    global _hook
    previous, _hook = _hook, hook
    return previous


__all__ = ["COMMIT", "TRACE_ENV", "commit_step", "install"]
