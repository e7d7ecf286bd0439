"""A deterministic scheduler that explores every schedule of a program up to a bound.

The program's actors (a driver, task attempts, a racing ``sparkeos recover``...) are
greenlets, coroutines with their own stacks in one thread, so only one runs at a time:
each calls ``point(label)`` before every step that another actor could observe (a
commit-log write, a call into the destination), and the scheduler decides who goes
next. Every decision (which actor runs, whether a fault is injected here) is a
numbered choice; a schedule is the list of choices made.
``explore`` enumerates them depth first, re-running the program from the start for
each prefix (stateless model checking, as in CHESS), within two bounds:

* ``delays``: how many times a schedule may run another actor than the default one
  (the running actor if it can go on, else the oldest that can) - delay bounding;
* fault budgets per kind (driver crash, task failure, speculative copy, ...) and in
  total.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

try:
    from greenlet import greenlet
except ImportError as exc:  # pragma: no cover - the extra is part of sparkeos[dev]
    raise ImportError("the model check runs its actors as greenlets: "
                      "pip install 'sparkeos[modelcheck]'") from exc

# Why greenlets and not threads: the code under test calls ``point()`` deep in its own
# stack, so each actor needs a stack of its own, but the turn passes strictly back and
# forth. With threads every hand-off was an OS wake-up of another thread; on a busy
# machine (the test suite's other worker, its JVMs) each waited for a free core, and the
# small bound (7,059 schedules then) took 95-140 s against 41 s alone. A greenlet
# switch stays in this thread.


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
    label: str = "start"
    ready: Callable[[], bool] | None = None
    state: str = "waiting"  # waiting | running | done
    kill: bool = False
    error: BaseException | None = None
    coroutine: greenlet | None = None

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
        self._hub: greenlet | None = None
        """Where the schedule runs and every actor returns its turn to."""
        self.on_step: Callable[[], None] | None = None
        self.on_turn: Callable[[Actor, str], None] | None = None
        """Called in the actor's greenlet when it gets the turn at a point: where the
        program injects faults (it may raise to crash or fail the actor)."""

    # -- used by actors ------------------------------------------------------------------
    def spawn(self, name: str, body: Callable[[], None], kind: str = "") -> Actor:
        assert self._hub is not None, "spawn() called before run()"
        actor = Actor(name, kind or name, self, body, len(self.actors))
        self.actors.append(actor)
        # Its parent is the hub, not the spawning actor: an actor that ends hands the
        # turn back to the schedule.
        actor.coroutine = greenlet(functools.partial(self._run_actor, actor),
                                   parent=self._hub)
        return actor

    def point(self, label: str, ready: Callable[[], bool] | None = None) -> None:
        """Give the schedule the turn before a step another actor may observe."""
        actor = self._me()
        actor.label, actor.ready, actor.state = label, ready, "waiting"
        assert self._hub is not None
        self._hub.switch()
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
        self._hub = greenlet.getcurrent()
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

    # -- internals ---------------------------------------------------------------------------
    def _choose(self, alternatives: int) -> int:
        depth = len(self.choices)
        chosen = self.prefix[depth] if depth < len(self.prefix) else 0
        self.choices.append((chosen, alternatives))
        return chosen

    def _resume(self, actor: Actor) -> None:
        self.current = actor
        actor.state = "running"
        assert actor.coroutine is not None
        actor.coroutine.switch()  # returns when the actor gives the turn back, or ends
        self.current = None

    def _me(self) -> Actor:
        me = self.current
        assert me is not None and me.coroutine is greenlet.getcurrent(), \
            "point() called outside the running actor"
        return me

    def _run_actor(self, actor: Actor) -> None:
        """The actor's body, from its first turn (its greenlet's first switch)."""
        try:
            if not actor.kill:
                actor.body()
        except Killed:
            pass
        except BaseException as exc:  # reported by the program's checks
            actor.error = exc
        finally:
            actor.state = "done"


def next_prefix(choices: list[tuple[int, int]]) -> list[int] | None:
    """The DFS successor of a finished schedule's choices (None: all explored)."""
    for depth in range(len(choices) - 1, -1, -1):
        chosen, alternatives = choices[depth]
        if chosen + 1 < alternatives:
            return [c for c, _ in choices[:depth]] + [chosen + 1]
    return None
