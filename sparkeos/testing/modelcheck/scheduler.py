"""A deterministic scheduler that explores every schedule of a program up to a bound.

The program's actors (a driver, task attempts, a racing ``sparkeos recover``...) are
threads, but only one runs at a time: each calls ``point(label)`` before every step
that another actor could observe (a commit-log write, a call into the destination),
and the scheduler decides who goes next. Every decision (which actor runs, whether a
fault is injected here) is a numbered choice; a schedule is the list of choices made.
``explore`` enumerates them depth first, re-running the program from the start for
each prefix (stateless model checking, as in CHESS), within two bounds:

* ``delays``: how many times a schedule may run another actor than the default one
  (the running actor if it can go on, else the oldest that can) - delay bounding;
* fault budgets per kind (driver crash, task failure, speculative copy, ...) and in
  total.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def _signal() -> Any:
    """A binary semaphore at 0: a held lock, which ``release()`` (from any thread) opens
    once and ``acquire()`` waits for. The turn passes strictly back and forth, so a
    signal is never given twice unanswered; a plain lock waits in C, where
    ``threading.Semaphore`` runs a condition variable in Python (measured: the check's
    wall time was mostly these hand-offs)."""
    lock = threading.Lock()
    lock.acquire()
    return lock


class Killed(BaseException):
    """Raised inside an actor the schedule ends (a crash, or the end of the run)."""


@dataclass
class Budget:
    """What a schedule may inject: per kind, and in total."""

    delays: int = 1
    total: int = 2
    kinds: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class Actor:
    name: str
    kind: str
    scheduler: Scheduler
    body: Callable[[], None]
    index: int
    semaphore: Any = field(default_factory=_signal)
    label: str = "start"
    ready: Callable[[], bool] | None = None
    state: str = "waiting"  # waiting | running | done
    kill: bool = False
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def enabled(self) -> bool:
        return self.state == "waiting" and (self.ready is None or self.ready())


class Scheduler:
    """Runs one schedule: follows ``prefix``, then the first alternative of each new
    choice, and records every choice point's alternatives for the DFS."""

    def __init__(self, prefix: list[int], budget: Budget) -> None:
        self.prefix = prefix
        self.budget = budget
        self.spent: dict[str, int] = {}
        self.delays_spent = 0
        self.choices: list[tuple[int, int]] = []  # (chosen, alternatives)
        self.trace: list[str] = []
        self.actors: list[Actor] = []
        self.current: Actor | None = None
        self._control = _signal()
        self.on_step: Callable[[], None] | None = None
        self.on_turn: Callable[[Actor, str], None] | None = None
        """Called in the actor's thread when it gets the turn at a point: where the
        program injects faults (it may raise to crash or fail the actor)."""

    # -- used by actors ------------------------------------------------------------------
    def spawn(self, name: str, body: Callable[[], None], kind: str = "") -> Actor:
        actor = Actor(name, kind or name, self, body, len(self.actors))
        self.actors.append(actor)
        actor.thread = threading.Thread(target=self._run_actor, args=(actor,), daemon=True,
                                        name=f"model-{name}")
        actor.thread.start()
        return actor

    def point(self, label: str, ready: Callable[[], bool] | None = None) -> None:
        """Give the schedule the turn before a step another actor may observe."""
        actor = self._me()
        actor.label, actor.ready, actor.state = label, ready, "waiting"
        self._control.release()
        actor.semaphore.acquire()
        if actor.kill:
            raise Killed(actor.name)
        actor.ready = None
        if self.on_turn is not None:
            self.on_turn(actor, label)

    def inject(self, kind: str, label: str) -> bool:
        """A choice point: inject a fault of ``kind`` here (within the budget)?"""
        used = self.spent.get(kind, 0)
        if used >= self.budget.kinds.get(kind, 0) or sum(self.spent.values()) >= (
                self.budget.total):
            return False
        if self._choose(2) == 0:
            return False
        self.spent[kind] = used + 1
        self.trace.append(f"  !! {kind}: {label}")
        return True

    def pick(self, options: list[Any], label: str) -> Any:
        """A choice among ``options`` (the first is the default and costs nothing)."""
        if len(options) == 1 or self.spent.get("choice", 0) >= self.budget.kinds.get(
                "choice", 0):
            return options[0]
        index = self._choose(len(options))
        if index:
            self.spent["choice"] = self.spent.get("choice", 0) + 1
            self.trace.append(f"  !! {label}: {options[index]}")
        return options[index]

    # -- the run --------------------------------------------------------------------------
    def run(self, main: Callable[[], None]) -> None:
        self.spawn("main", main, "main")
        last: Actor | None = None
        while True:
            enabled = [a for a in self.actors if a.enabled()]
            if not enabled:
                break
            default = last if last in enabled else enabled[0]
            chosen = default
            if len(enabled) > 1 and self.delays_spent < self.budget.delays:
                order = [default] + [a for a in enabled if a is not default]
                index = self._choose(len(order))
                if index:
                    self.delays_spent += 1
                chosen = order[index]
            self.trace.append(f"{chosen.name}: {chosen.label}")
            last = chosen
            self._resume(chosen)
            if self.on_step is not None:
                self.on_step()
        self.shutdown()

    def shutdown(self) -> None:
        """Kill every actor still waiting (blocked forever, or left behind)."""
        for actor in self.actors:
            if actor.state == "waiting":
                actor.kill = True
                self._resume(actor)
        for actor in self.actors:
            if actor.thread is not None:
                actor.thread.join(5)

    # -- internals ---------------------------------------------------------------------------
    def _choose(self, alternatives: int) -> int:
        depth = len(self.choices)
        chosen = self.prefix[depth] if depth < len(self.prefix) else 0
        self.choices.append((chosen, alternatives))
        return chosen

    def _resume(self, actor: Actor) -> None:
        self.current = actor
        actor.state = "running"
        actor.semaphore.release()
        self._control.acquire()
        self.current = None

    def _me(self) -> Actor:
        me = self.current
        assert me is not None and me.thread is threading.current_thread(), \
            "point() called outside the running actor"
        return me

    def _run_actor(self, actor: Actor) -> None:
        actor.semaphore.acquire()  # wait for the first turn
        try:
            if not actor.kill:
                actor.body()
        except Killed:
            pass
        except BaseException as exc:  # reported by the program's checks
            actor.error = exc
        finally:
            actor.state = "done"
            self._control.release()


def next_prefix(choices: list[tuple[int, int]]) -> list[int] | None:
    """The DFS successor of a finished schedule's choices (None: all explored)."""
    for depth in range(len(choices) - 1, -1, -1):
        chosen, alternatives = choices[depth]
        if chosen + 1 < alternatives:
            return [c for c, _ in choices[:depth]] + [chosen + 1]
    return None
