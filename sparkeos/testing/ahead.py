"""Job processes started ahead: the next kill-and-restart run warms up while this one runs.

A job process spends its first seconds on things that touch no state: Python imports,
the driver JVM, the Spark session. A test that kills the driver at N points runs N
such processes one after the other, each cold. Here each run hands its spec to a
process started during the previous run, already past its session start and waiting on
its standard input, and starts the one for the next run at once, on the core the
running job leaves idle.

Nothing durable is touched before the spec arrives (the query, the checkpoint, the
commit log and the lease come after), so a process started ahead is, to the protocol,
a process started now. It is used only for the same session settings (master, Spark
settings, working directory, environment); else it is discarded and a cold one starts.
Local masters only: a process waiting with a cluster's master would hold executors
(measured: the next cluster job waited for cores that never came). Only after a run
that kills its driver (``restart_follows``): a test restarts that run from its
checkpoint. Started after every run, the process left by each test's last run was
discarded by the next test (another working directory, other settings): 27 of 132
starts in one run of the suite, each a JVM and a session spent for nothing on cores
the two test sessions keep busy.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

from sparkeos.testing.joblog import log_time

FLAG = "--ahead"
"""``python -m MODULE --ahead SETTINGS``: make the session from the JSON ``SETTINGS``,
then ``wait_for_spec()``."""

_waiting: dict[str, subprocess.Popen[str]] = {}
"""At most one process, by the key of the session it holds."""
_late_dirs: list[str] = []
"""The plan directories of the processes started (removed at exit)."""


def restart_follows(plan: dict[str, str]) -> bool:
    """Whether the run of this fault plan (variables by name) kills its driver, so that
    the test runs it again in the same settings: a driver point of the protocol or of
    the source, a task point that kills the driver, a point of a real-time epoch."""
    from sparkeos.core import faults

    killing = {*faults.DRIVER_POINTS, *faults.DRIVER_KILLING_TASK_POINTS,
               *faults.REALTIME_POINTS, faults.COUNTED_POINT}
    fault = plan.get(faults.ENV_VAR, "").split("@")[0]
    source = plan.get(faults.SOURCE_ENV, "").split("@")[0]
    return fault in killing or (source in faults.SOURCE_POINTS
                                and not source.startswith("source_pause"))


def session_settings(spec: Any) -> dict[str, Any]:
    """What a started process has fixed before it reads its spec."""
    return {"master": spec.master, "spark_conf": spec.spark_conf, "connect": spec.connect}


VOLATILE_ENV = frozenset({"PYTEST_CURRENT_TEST"})
"""Changes with every test phase and means nothing to a job."""


def _key(module: str, settings: dict[str, Any], cwd: str | None, env: dict[str, str]) -> str:
    kept = sorted((k, v) for k, v in env.items() if k not in VOLATILE_ENV)
    text = json.dumps([module, settings, cwd, kept], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def start(module: str, settings: dict[str, Any], cwd: str | None,
          env: dict[str, str]) -> None:
    """Start a process for the next run with these settings (one at a time; none for a
    cluster's master, so ``take`` finds none for it either). Its plan comes late, so the
    processes Spark starts under it read the plan from a directory of its own
    (``SPARKEOS_FAULT_LATE_DIR``)."""
    from sparkeos.core.faults import LATE_DIR_ENV

    discard_all()
    if not str(settings.get("master", "local")).startswith("local"):
        return
    late = tempfile.mkdtemp(prefix="sparkeos-ahead-")
    _late_dirs.append(late)
    _waiting[_key(module, settings, cwd, env)] = subprocess.Popen(
        [sys.executable, "-m", module, FLAG, json.dumps(settings)], cwd=cwd,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**env, LATE_DIR_ENV: late}, start_new_session=True)


def take(module: str, settings: dict[str, Any], cwd: str | None, env: dict[str, str],
         spec_path: str, plan: dict[str, str]) -> subprocess.Popen[str] | None:
    """The waiting process for these settings, handed ``spec_path`` and ``plan`` (fault
    variables by name: ``{"SPARKEOS_FAULT": "after_decided@1"}``); None if there is none
    (or it died): the caller starts one cold."""
    proc = _waiting.pop(_key(module, settings, cwd, env), None)
    discard_all()
    if proc is None or proc.poll() is not None or proc.stdin is None:
        log_time("ahead-none", 0.0)  # the run starts cold
        return None
    try:
        proc.stdin.write(json.dumps({"spec": spec_path, "plan": plan}) + "\n")
        proc.stdin.close()
    except OSError:  # it died meanwhile
        _kill(proc)
        return None
    proc.stdin = None  # sent and closed: communicate() has nothing more to write
    log_time("ahead-taken", 0.0)
    return proc


def discard_all() -> None:
    while _waiting:
        _kill(_waiting.popitem()[1])
        log_time("ahead-discarded", 0.0)  # its start's CPU spent for nothing


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.communicate()


def _remove_late_dirs() -> None:
    while _late_dirs:
        shutil.rmtree(_late_dirs.pop(), ignore_errors=True)


atexit.register(discard_all)
atexit.register(_remove_late_dirs)


def spec_path(argv: list[str]) -> str | None:
    """A job module's spec: its argument, or started ahead (``FLAG``) what the run
    sends (``wait_for_spec``); None when a started process was not needed."""
    return wait_for_spec() if argv[0] == FLAG else argv[0]


def wait_for_spec() -> str | None:
    """In the started process: the path of the spec the run sends, its fault plan set in
    the environment (read when the query starts) and in ``$SPARKEOS_FAULT_LATE_DIR``
    (for the processes Spark starts); None at end of input (the test process went away
    or had no use for this process)."""
    from sparkeos.core.faults import LATE_DIR_ENV

    line = sys.stdin.readline()
    if not line.strip():
        return None
    order = json.loads(line)
    late = os.environ.get(LATE_DIR_ENV, "")
    for name, value in order["plan"].items():
        os.environ[name] = value
        if late:  # read by processes the query starts, so only after this returns
            with open(os.path.join(late, name), "w") as fh:
                fh.write(value)
    return str(order["spec"])
