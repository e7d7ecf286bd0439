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

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

try:
    from greenlet import getcurrent, greenlet
except ImportError as exc:  # pragma: no cover - the extra is part of sparkeos[dev]
    raise ImportError("the model check runs its actors as greenlets: "
                      "pip install 'sparkeos[modelcheck]'") from exc

# Why greenlets and not threads: the code under test calls ``point()`` deep in its own
# stack, so each actor needs a stack of its own, but the turn passes strictly back and
# forth. With threads every hand-off was an OS wake-up of another thread; on a busy
# machine (the test suite's other worker, its JVMs) each waited for a free core, and the
# small bound (7,059 schedules then) took 95-140 s against 41 s alone. A greenlet
# switch stays in this thread.
#
# The scheduling decision after a step is made where the step ended, in the actor's
# greenlet: the actor that goes on (the default, and most steps) goes on without a
# switch, and the turn passes to another actor with one switch, not two by way of a
# hub. The hub only starts the run, takes the turn when an actor's body ends, and
# shuts the run down. Nor does an actor get a greenlet of its own: a greenlet's life
# costs about ten switches (measured: 8 us; each maps and unmaps a stack for its Python
# frames), so actors run on greenlets kept in a pool.


_QUIESCENT = object()
"""What an actor hands the hub when no actor can take the next step."""

_pool = threading.local()
"""Per thread (a greenlet runs in the thread that made it): the idle workers."""


def _idle_workers() -> list[greenlet]:
    idle: list[greenlet] | None = getattr(_pool, "idle", None)
    if idle is None:
        idle = _pool.idle = []
    return idle


def _work(actor: Actor) -> None:
    """A worker greenlet: runs one actor, waits in the pool, runs the next."""
    while True:
        sched = actor.scheduler
        sched._run_actor(actor)
        if sched._over:
            # Only a greenlet being collected runs after its schedule ended (an actor
            # left blocked in the shutdown): it must end.
            return
        hub, idle = sched._hub, sched._idle
        assert hub is not None
        del actor, sched  # an idle worker keeps no schedule alive
        idle.append(getcurrent())
        # As a greenlet that ends hands the turn to its parent, the hub.
        actor = hub.switch()


class Killed(BaseException):
    """Raised inside an actor the schedule ends (a crash, or the end of the run)."""


class TaskDied(BaseException):
    """A task attempt's worker died (a BaseException: no cleanup runs, as in a crash)."""


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
    """The worker greenlet that runs it."""
    started: bool = False
    """Whether it had its first turn, which starts its body on the worker."""

    def enabled(self) -> bool:
        return self.state == "waiting" and (self.ready is None or self.ready())


class Scheduler:
    """Runs one schedule: follows ``prefix``, then the first alternative of each new
    choice, and records every choice point's alternatives for the DFS."""

    def __init__(self, prefix: list[int], budget: Budget) -> None:
        self.prefix = prefix
        self.budget = budget
        self.spent: dict[str, int] = {}
        self.spent_total = 0
        """``sum(spent.values())``, kept as it changes: ``inject`` asks at every point."""
        self.delays_spent = 0
        self.choices: list[tuple[int, int]] = []  # (chosen, alternatives)
        self.trace: list[str] = []
        self.actors: list[Actor] = []
        self.current: Actor | None = None
        self._live: list[Actor] = []
        """The actors not done, oldest first: those that may take the next step."""
        self._last: Actor | None = None
        """The actor of the last step: it goes on by default."""
        self._stopping = False
        self._over = False
        self._hub: greenlet | None = None
        """Where the schedule runs: the parent of every worker."""
        self._idle: list[greenlet] = []
        """The idle workers of the thread the schedule runs in."""
        self.on_step: Callable[[], None] | None = None
        self.on_turn: Callable[[Actor, str], None] | None = None
        """Called in the actor's greenlet when it gets the turn at a point: where the
        program injects faults (it may raise to crash or fail the actor)."""

    # -- used by actors ------------------------------------------------------------------
    def spawn(self, name: str, body: Callable[[], None], kind: str = "") -> Actor:
        assert self._hub is not None, "spawn() called before run()"
        actor = Actor(name, kind or name, self, body, len(self.actors))
        self.actors.append(actor)
        self._live.append(actor)
        # Its parent is the hub, not the spawning actor: an actor that ends hands the
        # turn back to the schedule.
        if self._idle:
            actor.coroutine = self._idle.pop()
            actor.coroutine.parent = self._hub
        else:
            actor.coroutine = greenlet(_work, parent=self._hub)
        return actor

    def point(self, label: str, ready: Callable[[], bool] | None = None) -> None:
        """Give the schedule the turn before a step another actor may observe."""
        actor = self.current
        assert actor is not None, "point() called outside an actor's turn"
        actor.label, actor.ready, actor.state = label, ready, "waiting"
        self._pass_turn(actor)
        if actor.kill:
            raise Killed(actor.name)
        actor.ready = None
        if self.on_turn is not None:
            self.on_turn(actor, label)

    def inject(self, kind: str, label: Callable[[], str]) -> bool:
        """A choice point: inject a fault of ``kind`` here (within the budget)?
        ``label`` says what for the trace, if so (asked at almost every step, mostly
        with the budget spent: the text is built only when it is used)."""
        if self.spent_total >= self.budget.total:
            return False
        used = self.spent.get(kind, 0)
        if used >= self.budget.kinds.get(kind, 0):
            return False
        if self._choose(2) == 0:
            return False
        self.spent[kind] = used + 1
        self.spent_total += 1
        self.trace.append(f"  !! {kind}: {label()}")
        return True

    def pick(self, options: list[Any], label: str) -> Any:
        """A choice among ``options`` (the first is the default and costs nothing)."""
        if len(options) == 1 or self.spent.get("choice", 0) >= self.budget.kinds.get(
                "choice", 0):
            return options[0]
        index = self._choose(len(options))
        if index:
            self.spent["choice"] = self.spent.get("choice", 0) + 1
            self.spent_total += 1
            self.trace.append(f"  !! {label}: {options[index]}")
        return options[index]

    # -- the run --------------------------------------------------------------------------
    def run(self, main: Callable[[], None]) -> None:
        self._hub = greenlet.getcurrent()
        self._idle = _idle_workers()
        try:
            self.spawn("main", main, "main")
            chosen = self._next_actor()
            while chosen is not None:
                if self._switch_to(chosen) is _QUIESCENT:
                    break
                # An actor's body ended (whichever actor the turn had passed to): so did
                # its step.
                self.current = None
                chosen = self._step_done()
            self.shutdown()
        finally:
            self._over = True

    def shutdown(self) -> None:
        """Kill every actor still waiting (blocked forever, or left behind)."""
        self._stopping = True
        for actor in self.actors:
            if actor.state == "waiting":
                actor.kill = True
                self._resume(actor)

    def _pass_turn(self, actor: Actor) -> None:
        """``actor`` ended its step at a point: run the next step (returns when it is
        ``actor``'s turn again)."""
        self.current = None
        assert self._hub is not None
        if self._stopping:
            self._hub.switch()  # the shutdown resumes each waiting actor once, to kill it
            return
        try:
            chosen = self._step_done()
        except BaseException as exc:
            # A failure of the exploration itself (``on_step``): it ends the run, as it
            # did from the hub, instead of looking like the actor's own.
            self._hub.throw(exc)
            raise
        if chosen is None:
            self._hub.switch(_QUIESCENT)
        elif chosen is not actor:
            self._switch_to(chosen)

    def _step_done(self) -> Actor | None:
        """After a step: ``on_step``, then the actor of the next step (its turn
        begun), None when no actor can go on."""
        if self.on_step is not None:
            self.on_step()
        return self._next_actor()

    def _next_actor(self) -> Actor | None:
        last = self._last
        if self.delays_spent >= self.budget.delays:
            # No choice left to make: the default, found without listing every actor
            # that could go on.
            if last is not None and last.enabled():
                chosen = last
            else:
                found = next((a for a in self._live if a.enabled()), None)
                if found is None:
                    return None
                chosen = found
        else:
            enabled = [a for a in self._live if a.enabled()]
            if not enabled:
                return None
            chosen = last if last in enabled else enabled[0]
            if len(enabled) > 1:
                order = [chosen] + [a for a in enabled if a is not chosen]
                index = self._choose(len(order))
                if index:
                    self.delays_spent += 1
                chosen = order[index]
        self.trace.append(f"{chosen.name}: {chosen.label}")
        self._last = chosen
        self.current = chosen
        chosen.state = "running"
        return chosen

    # -- internals ---------------------------------------------------------------------------
    def _choose(self, alternatives: int) -> int:
        depth = len(self.choices)
        chosen = self.prefix[depth] if depth < len(self.prefix) else 0
        self.choices.append((chosen, alternatives))
        return chosen

    def _resume(self, actor: Actor) -> None:
        """From the hub, in the shutdown: returns when the actor gives the turn back,
        or ends."""
        self.current = actor
        actor.state = "running"
        self._switch_to(actor)
        self.current = None

    def _switch_to(self, actor: Actor) -> Any:
        """Give ``actor`` the turn; its first turn starts it on its worker."""
        assert actor.coroutine is not None
        if actor.started:
            return actor.coroutine.switch()
        actor.started = True
        return actor.coroutine.switch(actor)

    def _run_actor(self, actor: Actor) -> None:
        """The actor's body, from its first turn."""
        try:
            if not actor.kill:
                actor.body()
        except Killed:
            pass
        except BaseException as exc:  # reported by the program's checks
            actor.error = exc
        finally:
            actor.state = "done"
            self._live.remove(actor)


def next_prefix(choices: list[tuple[int, int]]) -> list[int] | None:
    """The DFS successor of a finished schedule's choices (None: all explored)."""
    for depth in range(len(choices) - 1, -1, -1):
        chosen, alternatives = choices[depth]
        if chosen + 1 < alternatives:
            return [c for c, _ in choices[:depth]] + [chosen + 1]
    return None
