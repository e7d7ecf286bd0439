"""Two committers of one decided transaction, interleaved at the connector's named steps.

A connector marks the steps of its commit with ``core.steps.commit_step(name, txn)``
and lists them in ``commit_steps``. ``commit_pair`` runs two committers in threads of
this process: the first is held at one step while the second runs to a step of its own
(or to its end, or until it waits on something the first holds), then the first is let
go, then the second. The conformance suite tries every pair of positions. What drives
the interleaving is the steps, not sleeps; the only clock is how long the second
committer may take to reach its step before it counts as waiting on the first (a
database row lock), which changes which interleaving runs, never what is checked.

``commit_beside`` does the same against another process (``sparkeos recover --force``):
the first committer is held at a step while the process runs.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkeos.core import steps

HANG_S = 180.0
"""A committer still running after this long hangs: the test fails."""
WAITING_S = 1.0
"""How long the second committer may take to reach its step before it counts as
waiting on the first (then the first is let go)."""


_role = threading.local()


@dataclass
class _Committer:
    role: str
    hold_at: str | None
    commit: Callable[[], None]
    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    moved: threading.Event = field(default_factory=threading.Event)
    """Set when it reached its step or ended."""
    error: BaseException | None = None

    def start(self) -> None:
        def run() -> None:
            _role.name = self.role
            try:
                self.commit()
            except BaseException as exc:
                self.error = exc
            finally:
                self.done.set()
                self.moved.set()

        threading.Thread(target=run, daemon=True, name=f"sparkeos-{self.role}").start()

    def hold(self) -> None:
        """In the committer's thread, at its step: wait until let go."""
        self.reached.set()
        self.moved.set()
        self.released.wait(HANG_S)

    def state(self, within: float) -> str:
        """"held" (at its step), "done", or "waiting" (neither ``within`` seconds)."""
        self.moved.wait(within)
        if self.done.is_set():
            return "done"
        return "held" if self.reached.is_set() else "waiting"

    def finish(self) -> None:
        self.released.set()
        if not self.done.wait(HANG_S):
            raise AssertionError(f"committer {self.role} (held at {self.hold_at}) still "
                                 f"runs after {HANG_S:.0f} s: the commit hangs")


class _Holder:
    """The step hook: holds a committer at its step until it is let go."""

    def __init__(self, committers: Sequence[_Committer]) -> None:
        self.by_role = {c.role: c for c in committers}

    def __call__(self, name: str, txn: Any) -> None:
        committer = self.by_role.get(getattr(_role, "name", ""))
        if committer is not None and committer.hold_at == name \
                and not committer.reached.is_set():
            committer.hold()


@dataclass(frozen=True)
class PairOutcome:
    first_at: str
    second_at: str | None
    second: str
    """What the second committer did while the first was held: "held" at its step,
    "done", or "waiting" (on something the first holds)."""
    errors: dict[str, BaseException]


def _traced(path: str, step: str) -> bool:
    with open(path) as fh:
        return step in fh.read().split()


def _wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + HANG_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"the other process did not begin committing in {HANG_S} s")
        time.sleep(0.02)


def commit_pair(first: Callable[[], None], second: Callable[[], None], first_at: str,
                second_at: str | None) -> PairOutcome:
    """Run ``first`` until its step ``first_at``, then ``second`` until ``second_at``
    (None: to its end), then let both go, the first before the second."""
    one = _Committer("first", first_at, first)
    two = _Committer("second", second_at, second)
    previous = steps.install(_Holder((one, two)))
    try:
        one.start()
        one.moved.wait(HANG_S)
        two.start()
        state = two.state(WAITING_S)
        one.released.set()
        one.done.wait(WAITING_S)  # it may wait on what the second holds
        two.finish()
        one.finish()
    finally:
        steps.install(previous)
    errors = {c.role: c.error for c in (one, two) if c.error is not None}
    return PairOutcome(first_at, second_at, state, errors)


def commit_beside(first: Callable[[], None], first_at: str, command: Sequence[str],
                  env: dict[str, str] | None = None) -> tuple[PairOutcome, str]:
    """Run ``first`` until its step ``first_at``, then ``command`` (another process,
    e.g. ``sparkeos recover --force``) to its end, or until it waits on what the first
    holds; then let the first go. Returns the outcome and the command's output; a
    non-zero exit is an ``errors`` entry "process"."""
    one = _Committer("first", first_at, first)
    previous = steps.install(_Holder((one,)))
    try:
        one.start()
        one.moved.wait(HANG_S)
        handle, trace = tempfile.mkstemp(prefix="sparkeos-steps-")
        os.close(handle)
        proc = subprocess.Popen(list(command), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                env={**(env or os.environ), steps.TRACE_ENV: trace})
        try:
            _wait_until(lambda: proc.poll() is not None or _traced(trace, steps.COMMIT))
            try:
                proc.wait(WAITING_S)  # it began committing: it ends, or waits on the first
                state = "done"
            except subprocess.TimeoutExpired:
                state = "waiting"
        finally:
            os.unlink(trace)
        one.released.set()
        try:
            output, _ = proc.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            raise AssertionError(f"{' '.join(command)} still runs after {HANG_S:.0f} s:\n"
                                 f"{output}") from None
        one.finish()
    finally:
        steps.install(previous)
    errors: dict[str, BaseException] = {}
    if one.error is not None:
        errors["first"] = one.error
    if proc.returncode != 0:
        errors["process"] = RuntimeError(f"exit {proc.returncode}: {output[-3000:]}")
    return PairOutcome(first_at, None, state, errors), output


__all__ = ["HANG_S", "WAITING_S", "PairOutcome", "commit_beside", "commit_pair"]
