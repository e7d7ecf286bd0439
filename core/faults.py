"""Crash injection at protocol points, for the conformance suite and the demo.

A plan comes from the environment variable ``SPARKEOS_FAULT`` as ``point@batch``
(``after_decided@2``), or ``point`` for every batch. Production runs never set it; a
check is one attribute comparison.

Driver points kill the driver process (``os._exit``), as a power cut would: no
``finally`` blocks, no flushing. Task points run inside Spark's Python workers:

* ``kill_driver_after_first_prepare``: partition 0's task prepares, then kills the
  driver process (its PID travels with the plan), leaving some participants
  prepared and others not;
* ``after_first_commit`` for sinks that commit in tasks: the task that committed
  partition 0 kills the driver (for driver-committing sinks it is a driver point);
* ``task_fail_before_prepare`` / ``task_fail_after_prepare``: the first attempt of
  partition 0's task dies (its worker exits), so Spark retries it (or fails the
  job if the master allows no retries) under a new attempt ID; under
  ``at_least_once``, ``task_fail_after_prepare`` ends a direct task between the
  sink's ``prepare`` and its ``commit``;
* ``kill_executor_before_prepare``: the first attempt of partition 0's phase-1 task has
  written its rows, then SIGKILLs its executor's JVM (a lost worker), so the driver
  loses the executor and Spark runs the task again elsewhere;
* ``kill_executor_after_commit`` for sinks that commit in tasks: the first attempt of
  the phase-2 task of partition 0 commits, then SIGKILLs its executor before its
  result reaches the driver, so Spark runs the commit again elsewhere.

The executor points need a cluster: under ``local[*]`` the executor is the driver's
JVM, so they end the task's worker only (as ``task_fail_*``).

Speculation scenarios (for a cluster with ``spark.speculation=true``) hold the first
attempt of partition 0 back until Spark launched a speculative copy, without timing:
the attempts and the driver leave signal files in ``$SPARKEOS_FAULT_DIR`` and wait for
each other's:

* ``speculate_copy_wins``: the original waits, before ``begin``, until the driver
  recorded the batch's decision (which the copy's result made possible), then goes on
  as a zombie if Spark has not killed it;
* ``speculate_original_wins``: the original waits until the copy has started, then
  writes and prepares; the copy waits until the batch is decided, then goes on as a
  zombie if Spark has not killed it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

ENV_VAR = "SPARKEOS_FAULT"
CRASH_EXIT_CODE = 86

DRIVER_POINTS = (
    "after_begun",
    "after_all_prepared",
    "after_decided",
    "after_first_commit",
    "after_all_commits",
    "after_finished",
)
TASK_POINTS = (
    "kill_driver_after_first_prepare",
    "task_fail_before_prepare",
    "task_fail_after_prepare",
)
EXECUTOR_POINTS = ("kill_executor_before_prepare", "kill_executor_after_commit")
ALL_POINTS = DRIVER_POINTS + TASK_POINTS
DIRECT_POINTS = ("kill_task_mid_write", "kill_task_mid_write_after_first_commit")
"""For ``at_least_once``: ``kill_task_mid_write``: the first attempt of partition 0's
task dies (its worker exits at once) after writing its first rows, before its
transaction is committed. ``kill_task_mid_write_after_first_commit``: the first attempt
of partition 1's task, after its first rows, waits until partition 0's task committed
(a signal file in ``$SPARKEOS_FAULT_DIR``), then dies the same way: a batch half
written, the case of a replay partitioned otherwise."""
AFTER_FIRST_COMMIT_SIGNAL = "direct-committed-p0"
REALTIME_POINTS = ("epoch_mid_write", "epoch_before_commit", "epoch_after_commit")
"""Real-time mode (``core.streaming.realtime``), in partition 0's task of the epoch: the
driver's whole process group is killed after the task's first rows reached the sink,
right before its commit, or right after it (Spark has not recorded the epoch then)."""
WORKER_EPOCH_POINT = "epoch_worker_killed"
"""Real-time mode: partition 0's Python worker kills itself (kill -9) after the epoch's
first rows reached the sink; the driver lives on and sees its task fail."""
SPECULATION_POINTS = ("speculate_copy_wins", "speculate_original_wins")
PAUSE_POINTS = ("hold_in_phase_1",)
"""Not a crash: ``hold_in_phase_1``: the first attempt of partition 0's phase-1 task,
its rows written, leaves ``held`` in ``$SPARKEOS_FAULT_DIR`` and waits for ``release``
there (a batch as long as a test needs, e.g. to run ``sparkeos recover`` beside it)."""
COUNTED_POINT = "kill_once_spark_counted"
"""With ``overlap_commits``: the background phase 2 of the batch waits, before its first
commit, until Spark's own commit log holds the batch (``<checkpoint>/commits/<batch>``:
Spark counts it done, and a restart will not run it again), then kills the driver. A
restart without new input runs no batch: what finishes this one is the start hook
(``core.streaming.onstart``)."""
BARRIER_ENV = "SPARKEOS_FAULT_DIR"
KILL_GROUP_ENV = "SPARKEOS_FAULT_KILL_GROUP"
"""A process group to kill for a driver crash. Under Spark Connect the foreachBatch
function runs in a Python process of the server, not in the driver: the test job
names its own group (client, Connect server and workers), so a driver crash kills
all of it, as a power cut would."""
LATE_DIR_ENV = "SPARKEOS_FAULT_LATE_DIR"
"""A directory where a process started before its plan was known (a test's job process
started ahead: ``sparkeos.testing.ahead``) and the processes Spark starts under it find
the plan: a file named after the variable (``SPARKEOS_FAULT``, ``SPARKEOS_SOURCE_FAULT``)
holds its value. Spark's Python workers and a source's runner inherit the environment the
driver's JVM started with, not the one of the moment the plan arrived."""


def plan_setting(name: str) -> str:
    """The value of the plan variable ``name``: from the environment, else from the file
    of that name in ``$SPARKEOS_FAULT_LATE_DIR``; empty when neither gives one."""
    value = os.environ.get(name, "").strip()
    late = os.environ.get(LATE_DIR_ENV, "")
    if value or not late:
        return value
    try:
        with open(os.path.join(late, name)) as fh:
            return fh.read().strip()
    except FileNotFoundError:
        return ""


BARRIER_WAIT_S = 300.0
"""How long an attempt waits for the other attempt's signal. Only a cluster that never
launches the speculative copy waits this long; the test then fails on its check that
the copy ran."""
DRIVER_KILLING_TASK_POINTS = frozenset({"kill_driver_after_first_prepare", "after_first_commit"})
"""Task-side points that kill the driver. ``after_first_commit`` is a driver point for
sinks that commit on the driver; for sinks that commit in tasks (CommitLocation.TASKS)
the task that committed partition 0 kills the driver instead."""


class InjectedCrash(BaseException):
    """In-process stand-in for a killed process (``simulate=True``).

    A BaseException, so no ``except Exception`` on the way runs cleanup a real crash
    would never run."""


class InjectedTaskFailure(Exception):
    """In-process stand-in for a dead task attempt (``simulate=True``)."""


@dataclass(frozen=True)
class FaultPlan:
    point: str | None = None
    batch_id: int | None = None
    driver_pid: int = 0
    simulate: bool = False
    """Raise InjectedCrash / InjectedTaskFailure instead of killing processes."""
    barrier_dir: str = ""
    """Where speculation scenarios leave their signal files."""
    kill_group: int = 0
    """Kill this process group for a driver crash (see ``KILL_GROUP_ENV``); 0: the
    driver process itself."""

    @classmethod
    def from_env(cls) -> FaultPlan:
        spec = plan_setting(ENV_VAR)
        if not spec:
            return cls()
        point, _, batch = spec.partition("@")
        known = (ALL_POINTS + SPECULATION_POINTS + EXECUTOR_POINTS + DIRECT_POINTS
                 + PAUSE_POINTS + REALTIME_POINTS + (COUNTED_POINT, WORKER_EPOCH_POINT))
        if point not in known:
            raise ValueError(f"{ENV_VAR}={spec!r}: unknown point; use one of {known}")
        barrier = plan_setting(BARRIER_ENV)
        if (point in SPECULATION_POINTS + PAUSE_POINTS
                or point == "kill_task_mid_write_after_first_commit") and not barrier:
            raise ValueError(f"{ENV_VAR}={spec!r} needs {BARRIER_ENV} (a directory every "
                             "executor can reach) for its signal files")
        group = os.environ.get(KILL_GROUP_ENV, "")
        return cls(point, int(batch) if batch else None, os.getpid(), barrier_dir=barrier,
                   kill_group=int(group) if group.isdigit() else 0)

    def kill_driver(self) -> None:
        if self.kill_group:
            os.killpg(self.kill_group, signal.SIGKILL)
            time.sleep(60)  # killed with the group
        os._exit(CRASH_EXIT_CODE)

    def _matches(self, point: str, batch_id: int) -> bool:
        return self.point == point and (self.batch_id is None or self.batch_id == batch_id)

    def plans(self, point: str, batch_id: int) -> bool:
        """Whether this plan fires at ``point`` in ``batch_id`` (a step that runs work
        side by side may run it in order then, so the point falls where its name says)."""
        return self._matches(point, batch_id)

    def driver(self, point: str, batch_id: int) -> None:
        if self._matches(point, batch_id):
            if self.simulate:
                raise InjectedCrash(f"{point}@{batch_id}")
            print(f"sparkeos fault injection: driver crash at {point} batch {batch_id}",
                  file=sys.stderr, flush=True)
            self.kill_driver()

    def counted_by_spark(self, batch_id: int, checkpoint: str | None) -> None:
        """``kill_once_spark_counted`` (a local checkpoint): wait for Spark's commit of
        the batch, then crash the driver."""
        if not self._matches(COUNTED_POINT, batch_id) or checkpoint is None:
            return
        if self.simulate:
            raise InjectedCrash(f"{COUNTED_POINT}@{batch_id}")
        root = checkpoint.removeprefix("file://").removeprefix("file:")
        committed = os.path.join(root, "commits", str(batch_id))
        deadline = time.monotonic() + BARRIER_WAIT_S
        while not os.path.exists(committed) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.driver(COUNTED_POINT, batch_id)

    def task(self, point: str, batch_id: int, partition: int, attempt_number: int) -> None:
        if partition != 0 or attempt_number != 0 or not self._matches(point, batch_id):
            return
        if self.simulate:
            if point in DRIVER_KILLING_TASK_POINTS:
                raise InjectedCrash(f"{point}@{batch_id}")
            raise InjectedTaskFailure(f"{point}@{batch_id}")
        if point in DRIVER_KILLING_TASK_POINTS:
            if self.kill_group:
                self.kill_driver()
            os.kill(self.driver_pid, signal.SIGKILL)
            time.sleep(60)  # the JVM dies with the driver and takes this worker along
        if point in EXECUTOR_POINTS:
            executor = _executor_jvm()
            if executor:
                print(f"sparkeos fault injection: executor (pid {executor}) killed at "
                      f"{point} batch {batch_id}", file=sys.stderr, flush=True)
                if self.barrier_dir:  # the test's evidence (this stderr is the executor's)
                    self._signal(f"executor-killed-{point}")
                os.kill(executor, signal.SIGKILL)
                time.sleep(60)  # the worker ends with its executor
        os._exit(CRASH_EXIT_CODE)

    def epoch(self, point: str, epoch: int, partition: int) -> None:
        """A real-time task of partition 0 at ``point`` (``REALTIME_POINTS``): the
        driver's process group is killed (the task's worker with it). With
        ``WORKER_EPOCH_POINT`` planned, the task's own Python worker is killed at
        ``epoch_mid_write`` instead (every attempt that gets there: a retry too)."""
        if (partition == 0 and point == "epoch_mid_write"
                and self._matches(WORKER_EPOCH_POINT, epoch) and not self.simulate):
            print(f"sparkeos fault injection: Python worker killed in epoch {epoch}",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if partition != 0 or not self._matches(point, epoch):
            return
        if self.simulate:
            raise InjectedCrash(f"{point}@{epoch}")
        print(f"sparkeos fault injection: driver crash at {point} epoch {epoch}",
              file=sys.stderr, flush=True)
        os.killpg(self.kill_group or driver_group(), signal.SIGKILL)
        time.sleep(60)  # killed with the group

    def hold(self, batch_id: int, partition: int, attempt_number: int) -> None:
        """``hold_in_phase_1``: wait for the test's ``release`` (see ``PAUSE_POINTS``)."""
        if (partition != 0 or attempt_number != 0 or self.simulate
                or not self._matches("hold_in_phase_1", batch_id)):
            return
        self._signal("held")
        self._wait("release")

    # -- at-least-once tasks -----------------------------------------------------------------
    def mid_write(self, batch_id: int, partition: int, attempt_number: int) -> None:
        """A direct task wrote its first rows (``DIRECT_POINTS``)."""
        if self._matches("kill_task_mid_write", batch_id):
            self.task("kill_task_mid_write", batch_id, partition, attempt_number)
        point = "kill_task_mid_write_after_first_commit"
        if partition != 1 or attempt_number != 0 or not self._matches(point, batch_id):
            return
        if self.simulate:
            raise InjectedTaskFailure(f"{point}@{batch_id}")
        self._wait(AFTER_FIRST_COMMIT_SIGNAL)
        print(f"sparkeos fault injection: task of partition 1 killed at {point} batch "
              f"{batch_id}", file=sys.stderr, flush=True)
        os._exit(CRASH_EXIT_CODE)

    def direct_committed(self, batch_id: int, partition: int) -> None:
        """A direct task committed its transaction."""
        point = "kill_task_mid_write_after_first_commit"
        if (partition == 0 and not self.simulate and self.barrier_dir
                and self._matches(point, batch_id)):
            self._signal(AFTER_FIRST_COMMIT_SIGNAL)

    # -- speculation scenarios ------------------------------------------------------------
    def _speculating(self, batch_id: int) -> bool:
        return (not self.simulate and self.point in SPECULATION_POINTS
                and self._matches(str(self.point), batch_id))

    def before_begin(self, batch_id: int, partition: int, attempt_number: int) -> None:
        if partition != 0 or not self._speculating(batch_id):
            return
        copy = attempt_number > 0
        self._signal("copy-started" if copy else "original-started")
        if self.point == "speculate_copy_wins":
            if not copy:
                self._wait("decided")
        elif copy:
            self._wait("decided")
        else:
            self._wait("copy-started")

    def decided(self, batch_id: int) -> None:
        """The driver recorded the decision of ``batch_id`` (releases the loser)."""
        if self._speculating(batch_id):
            self._signal("decided")

    def _signal(self, name: str) -> None:
        os.makedirs(self.barrier_dir, exist_ok=True)
        with open(os.path.join(self.barrier_dir, name), "a") as fh:
            fh.write(f"{os.getpid()}\n")

    def _wait(self, name: str) -> None:
        path = os.path.join(self.barrier_dir, name)
        deadline = time.monotonic() + BARRIER_WAIT_S
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)


def driver_group() -> int:
    """The process group of the driver this Spark Python worker serves: the group of
    its nearest ancestor outside its own (Spark's worker daemon makes a group of its
    own; the JVM that started it is in the driver's)."""
    own = os.getpgid(0)
    pid = os.getppid()
    while pid > 1:
        try:
            group = os.getpgid(pid)
            if group != own:
                return group
            pid = _parent(pid)
        except (OSError, ValueError, IndexError):
            break
    return own


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _executor_jvm() -> int:
    """The PID of the executor JVM this Python worker serves (its nearest ancestor
    running ``CoarseGrainedExecutorBackend``), 0 if there is none (local mode)."""
    pid = os.getppid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"CoarseGrainedExecutorBackend" in fh.read():
                    return pid
            pid = _parent(pid)
        except (OSError, ValueError, IndexError):
            return 0
    return 0


SOURCE_ENV = "SPARKEOS_SOURCE_FAULT"
SOURCE_POINTS = ("source_after_spool", "source_before_ack", "source_after_ack",
                 "source_pause_after_spool")
"""Points of an acknowledging source (Spark's source runner process, a child of the
driver's JVM). ``SPARKEOS_SOURCE_FAULT=point@k`` acts the k-th time (default the
first) the point is reached in that process:

* ``source_after_spool``: a pull is spooled and its IDs recorded, the offset not yet
  returned to Spark (so never recorded in the offset log);
* ``source_before_ack`` / ``source_after_ack``: around the confirmed ACK of a
  committed batch, before its IDs are forgotten;
* ``source_pause_after_spool``: not a crash; leave ``paused`` in ``$SPARKEOS_FAULT_DIR``
  and wait for ``resume`` there (a test restarts the broker meanwhile).

A crash kills the whole process group of the job (driver, JVM, workers), as losing
the driver's machine would."""


class SourceFaults:
    def __init__(self) -> None:
        spec = plan_setting(SOURCE_ENV)
        point, _, count = spec.partition("@")
        if point and point not in SOURCE_POINTS:
            raise ValueError(f"{SOURCE_ENV}={spec!r}: unknown point; use one of "
                             f"{SOURCE_POINTS}")
        self.point = point or None
        self.count = int(count) if count else 1
        self.seen = 0

    def reached(self, point: str) -> None:
        if point != self.point:
            return
        self.seen += 1
        if self.seen != self.count:
            return
        if point == "source_pause_after_spool":
            barrier = os.environ.get(BARRIER_ENV, "")
            plan = FaultPlan(barrier_dir=barrier)
            plan._signal("paused")
            plan._wait("resume")
            return
        print(f"sparkeos fault injection: job killed at {point} #{self.count}",
              file=sys.stderr, flush=True)
        os.killpg(os.getpgid(0), signal.SIGKILL)
        time.sleep(60)


def task_attempt_number() -> int:
    """The running Spark task's attempt number (0 outside a Spark task)."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
    except ImportError:
        return 0
    return context.attemptNumber() if context is not None else 0
