"""A small streaming job run in a child process, so tests and the demo can kill it.

    python -m sparkeos.testing.job spec.json

The spec (JSON) names the input directory of JSON-lines files (``id``, ``payload``),
the checkpoint, the mode (``exactly_once``, ``at_least_once``, ``plain`` or
``function``) and the sink as ``{"factory": "module:callable", "kwargs": {...}}``. For
``plain`` the factory returns a foreachBatch function (what users write without
sparkeos); for ``function`` it returns a foreachBatch function that uses sparkeos
itself (several sinks in one query, say). Faults come from
``SPARKEOS_FAULT`` (see ``sparkeos.core.faults``); in plain mode any fault kills the
driver after the batch named in it was written, before Spark records the batch.

``run_job`` picks where a run goes: a run something kills gets a process of its own,
started ahead of time where it can be (``sparkeos.testing.ahead``); a run nothing kills
goes through the warm session of the calling process.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkeos.core.faults import CRASH_EXIT_CODE, ENV_VAR
from sparkeos.testing import ahead
from sparkeos.testing.joblog import log_time

INPUT_SCHEMA = "id long, payload string"
JOB_MODULE = "sparkeos.testing.job"


@dataclass
class JobSpec:
    input: str
    checkpoint: str
    sink: dict[str, Any]
    name: str = "conformance"
    mode: str = "exactly_once"
    master: str = "local[2]"
    partitions: int = 2
    max_files_per_trigger: int = 1
    spark_conf: dict[str, str] = field(default_factory=dict)
    metrics_file: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    """Coordinator settings for ``exactly_once(...)`` (``existing_output``...)."""
    connect: bool = False
    """Run through Spark Connect (``SparkSession.builder.remote(master)``: a local
    Connect server for ``local[...]``); a driver crash kills the whole job."""
    route: str = "foreachBatch"
    """``"format"``: write through the sink's Spark format (``sparkeos.register``);
    ``sink`` is then ``{"format": name, "options": {...}}``, with ``"select"``: the
    SQL expressions the stream is projected to first (e.g. a Kafka ``value``)."""
    register_formats: bool = False
    """Format route in a classic session: ``sparkeos.register(spark)`` first (else
    Spark's discovery of the installed formats, as a user's session finds them)."""
    session_checkpoint: bool = False
    """Set the checkpoint as most production jobs do, in the session
    (``spark.sql.streaming.checkpointLocation``: Spark then checkpoints each query in a
    fresh ``<checkpoint>/<uuid>``), not as the query's option, and give sparkeos no
    ``checkpoint_location``."""


@dataclass
class JobResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def crashed(self) -> bool:
        return self.returncode in (CRASH_EXIT_CODE, -signal.SIGKILL)

    def tail(self, lines: int = 40) -> str:
        return "\n".join((self.stdout + self.stderr).splitlines()[-lines:])

    @property
    def python_worker_not_started(self) -> bool:
        """Spark gave up on a Python worker it started (a data source's runner or
        planner): it waits a fixed 10 s for the worker to connect back, which a
        machine under load can miss (measured once in CI: a query's start took 99 s)."""
        return self.returncode != 0 and not self.crashed and (
            WORKER_NOT_STARTED in self.stderr)


WORKER_NOT_STARTED = "Python worker failed to connect back"
RETRIED_NOTE = ("\n[sparkeos.testing] Spark's Python worker did not connect back within "
                "Spark's fixed 10 s (a machine under load): the run was started again\n")


def _timed(run: Callable[[], JobResult], kind: str) -> JobResult:
    started = time.monotonic()
    result = run()
    log_time(kind, time.monotonic() - started, result.returncode)
    return result


def again_if_worker_not_started(run: Callable[[], JobResult], kind: str = "process"
                                ) -> JobResult:
    """``run()``, and once more if Spark could not start its Python worker in time:
    Spark's own timing, not the job's. The second run is a restart from durable state,
    as every run is (what a user's restart policy does after this failure). ``kind``:
    where the run runs, for ``$SPARKEOS_JOB_LOG``."""
    result = _timed(run, kind)
    if not result.python_worker_not_started:
        return result
    print(RETRIED_NOTE.strip(), file=sys.stderr)
    again = _timed(run, kind)
    return JobResult(again.returncode, again.stdout, result.stderr + RETRIED_NOTE + again.stderr)


def load_factory(ref: str) -> Callable[..., Any]:
    module, _, attr = ref.partition(":")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    return target  # type: ignore[no-any-return]


def write_input(directory: str, ids_per_file: Iterable[Iterable[int]]) -> list[int]:
    """Write one JSON-lines file per batch; return every id written."""
    os.makedirs(directory, exist_ok=True)
    written: list[int] = []
    for index, ids in enumerate(ids_per_file):
        path = os.path.join(directory, f"input-{index:05d}.json")
        with open(path + ".tmp", "w") as fh:
            for i in ids:
                fh.write(json.dumps({"id": i, "payload": f"row-{i}"}) + "\n")
                written.append(i)
        os.replace(path + ".tmp", path)
        # Distinct, increasing modification times keep the file source's order stable.
        os.utime(path, (1_700_000_000 + index, 1_700_000_000 + index))
    return written


def plain_file_writer(path: str, format: str = "parquet") -> Callable[[Any, int], None]:
    """The at-least-once foreachBatch file write users write without sparkeos."""

    def write(df: Any, batch_id: int) -> None:
        writer = df.write.mode("append")
        if format == "parquet":
            writer.parquet(path)
        else:
            writer.json(path)

    return write


def crash_after_write(write: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
    """A plain foreachBatch function that dies as ``SPARKEOS_FAULT`` says.

    Plain writers have no protocol points: any fault kills the driver right after the
    named batch was written, before Spark records it, so the restart writes it again.
    """
    from sparkeos.core.faults import FaultPlan

    fault = FaultPlan.from_env()

    def batch_fn(batch_df: Any, batch_id: int) -> None:
        write(batch_df, batch_id)
        if fault.point and fault.batch_id in (None, batch_id):
            fault.kill_driver()

    return batch_fn


SHORT_JOB_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
SHORT_JOB_CONF = {
    "spark.driver.extraJavaOptions": SHORT_JOB_JAVA_OPTIONS,
    "spark.executor.extraJavaOptions": SHORT_JOB_JAVA_OPTIONS,
}
"""JVM settings for these jobs: each runs seconds, mostly JVM start-up and first
calls, where the optimising JIT compiler only competes for the cores (measured: three
driver-kill cases 55 s -> 46 s on 2 cores). Not for benchmarks, which run long."""
LONG_SESSION_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4"}
"""The JIT's default (the optimising compiler too), for a session that serves a whole
test run (``warm_session``): it overrides ``short_job_submit_options`` inherited."""


def short_job_submit_options() -> str:
    """``SPARK_SUBMIT_OPTS`` for every Spark driver a test run starts, whatever starts
    it (a job module, an example script, ``sparkeos demo``, a doc block, a Connect
    server): the JIT of ``SHORT_JOB_CONF`` and the class-data archive
    (``sparkeos.testing.cds``). An example's own ``SparkSession.builder`` took 35.7 s to
    run Kafka -> Kafka without them, 22.7 s with them."""
    from sparkeos.core.streaming.spark import class_archive_options

    return f"{SHORT_JOB_JAVA_OPTIONS} {class_archive_options()}".strip()


def run_job_process(spec: JobSpec, fault: str | None = None, timeout: float = 300.0,
                    env: dict[str, str] | None = None, cwd: str | None = None,
                    barrier: str | None = None) -> JobResult:
    """Run the job in a child process (own process group, killed whole afterwards).
    ``barrier``: the fault's signal directory (``SPARKEOS_FAULT_DIR``), part of its plan,
    so a process started ahead can take the run."""
    # Beside a local checkpoint, else beside the (always local) input.
    spec_path = (spec.checkpoint + ".spec.json" if "://" not in spec.checkpoint
                 else os.path.join(os.path.dirname(spec.input), f"job-{spec.mode}.spec.json"))
    # The fault reaches a started process with its spec (sparkeos.testing.ahead). Settings
    # in ``env`` are needed at start, and a local Connect server listens on a fixed port
    # (two cannot run at once): those runs start cold.
    settings = ahead.session_settings(spec) if env is None and not spec.connect else None
    return run_spec_process(JOB_MODULE, asdict(spec), spec_path, fault, timeout, env, cwd,
                            ahead_settings=settings, barrier=barrier)


def run_job(spec: JobSpec, fault: str | None = None, timeout: float = 300.0,
            barrier: str | None = None) -> JobResult:
    """Run the job: in a child process when a fault is planned (something will be
    killed), else in this process's warm Spark session when the spec allows it
    (``runs_warm``). Either way the run starts from durable state only (the checkpoint,
    the commit log, the destination): a warm run shares no memory with any driver a
    test killed, so a restart proves the same recovery. Saves a JVM start and a first
    batch (about 7 s here) per run."""
    if fault is None and runs_warm(spec):
        return run_in_session(spec, timeout)
    return run_job_process(spec, fault, timeout, barrier=barrier)


def runs_warm(spec: JobSpec) -> bool:
    """Whether ``spec`` runs the same in the warm session as in a job process: classic
    local Spark with the session's master and no settings of its own."""
    return not spec.connect and spec.master == WARM_MASTER and not spec.spark_conf


WARM_MASTER = "local[2]"


def warm_session() -> Any:
    """This process's local Spark session (``local[2]``, made on first use; an
    existing session of the same process is taken as it is)."""
    from sparkeos.core.streaming.spark import local_session

    return local_session("sparkeos-warm-jobs", WARM_MASTER, LONG_SESSION_CONF)


def run_in_session(spec: JobSpec, timeout: float = 300.0) -> JobResult:
    """Run the job in the warm session of this process (``run_warm``)."""
    return run_warm(lambda spark: run_spec(spec, spark, timeout))


def run_warm(job: Callable[[Any], object]) -> JobResult:
    """Run ``job(warm_session())`` in this process; a failure is a non-zero
    ``JobResult`` carrying the traceback, as from a job process."""
    import traceback

    def once() -> JobResult:
        try:
            job(warm_session())
        except Exception:  # a job's failure is its result
            return JobResult(1, "", traceback.format_exc())
        return JobResult(0, "", "")

    return again_if_worker_not_started(once, "warm")


def _child_env(env: dict[str, str] | None, plan: dict[str, str]) -> dict[str, str]:
    """The environment of a job process: this one's, ``env``, and the fault ``plan``
    (variables by name) in place of any plan this process has."""
    from sparkeos.core.faults import BARRIER_ENV, LATE_DIR_ENV, SOURCE_ENV

    child_env = {**os.environ, **(env or {})}
    # What the test process can import (a sink factory beside the tests), the job can.
    child_env["PYTHONPATH"] = os.pathsep.join(
        [p for p in sys.path if p] + [child_env["PYTHONPATH"]]
        if child_env.get("PYTHONPATH") else [p for p in sys.path if p])
    for name in (ENV_VAR, SOURCE_ENV, LATE_DIR_ENV, BARRIER_ENV):
        if name not in (env or {}):
            child_env.pop(name, None)
    child_env.update(plan)
    child_env.setdefault("PYSPARK_PYTHON", sys.executable)
    return child_env


def _write_spec(spec: dict[str, Any], spec_path: str) -> None:
    os.makedirs(os.path.dirname(spec_path) or ".", exist_ok=True)
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)


def run_spec_process(module: str, spec: dict[str, Any], spec_path: str,
                     fault: str | None = None, timeout: float = 300.0,
                     env: dict[str, str] | None = None, cwd: str | None = None,
                     ahead_settings: dict[str, Any] | None = None,
                     source_fault: str | None = None, barrier: str | None = None) -> JobResult:
    """Run ``python -m module spec.json`` with ``SPARKEOS_FAULT`` set to ``fault`` (and
    ``SPARKEOS_SOURCE_FAULT`` to ``source_fault``).

    The child gets its own process group, which is killed whole afterwards: a killed
    driver leaves its JVM and Python workers behind otherwise. With ``ahead_settings``
    (what the module's ``--ahead`` mode makes its session from) the run takes a process
    started ahead for them if there is one, and starts the next run's at once
    (``sparkeos.testing.ahead``).
    """
    from sparkeos.core.faults import BARRIER_ENV, ENV_VAR, SOURCE_ENV

    _write_spec(spec, spec_path)
    plan = {name: value for name, value in ((ENV_VAR, fault), (SOURCE_ENV, source_fault),
                                            (BARRIER_ENV, barrier)) if value}

    def once() -> JobResult:
        proc = None
        if ahead_settings is not None:
            base_env = _child_env(env, {})
            proc = ahead.take(module, ahead_settings, cwd, base_env, spec_path, plan)
            if ahead.restart_follows(plan):  # warms up beside this run
                ahead.start(module, ahead_settings, cwd, base_env)
        if proc is None:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, spec_path], cwd=cwd, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, env=_child_env(env, plan),
                start_new_session=True)
        return collect_job(proc, timeout)

    return again_if_worker_not_started(once)


def collect_job(proc: subprocess.Popen[str], timeout: float) -> JobResult:
    """Wait for a job process (started with ``start_new_session=True``), then kill its
    group (a killed driver's JVM and workers)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        err += f"\n[sparkeos.testing] job killed after {timeout:.0f} s timeout"
    finally:
        _kill_group(proc.pid)  # the JVM and Python workers of a killed driver
    return JobResult(proc.returncode, out, err)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def ship_to_workers(*objects: Any) -> list[str]:
    """Make the modules that define ``objects`` (a connector's sink and factory) reach
    Spark's Python workers whatever their ``sys.path``: a connector in a directory of its
    own is importable in this process, but not on a cluster's executors or in a Spark
    Connect server's workers (``ModuleNotFoundError`` in phase 1). Such modules (outside
    site-packages and sparkeos itself) are pickled by value, their whole top-level
    package. Returns the names of the packages shipped."""
    from pyspark import cloudpickle

    shipped = []
    for obj in objects:
        module_name = getattr(obj, "__module__", None) or type(obj).__module__
        top = module_name.split(".", 1)[0]
        module = sys.modules.get(top)
        path = str(getattr(module, "__file__", "") or "")
        if (module is None or not path or top in ("sparkeos", "builtins", "__main__")
                or os.sep + "site-packages" + os.sep in path
                or os.sep + "dist-packages" + os.sep in path
                or path.startswith(sys.base_prefix)):
            continue
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
        shipped.append(top)
    return shipped


def _session(settings: dict[str, Any], app_name: str) -> Any:
    from sparkeos.core.faults import KILL_GROUP_ENV
    from sparkeos.core.streaming.spark import connect_session, local_session

    conf = {**SHORT_JOB_CONF, **settings["spark_conf"]}
    if settings["connect"]:
        # The batch function runs in the Connect server's Python process: a driver
        # crash there kills this job's whole process group (run_job_process made it).
        os.environ[KILL_GROUP_ENV] = str(os.getpgid(0))
        return connect_session(app_name, settings["master"], conf)
    return local_session(app_name, settings["master"], conf)


def _load_spec(path: str) -> JobSpec:
    with open(path) as fh:
        return JobSpec(**json.load(fh))


def main(argv: list[str]) -> int:
    if argv[0] == ahead.FLAG:  # started ahead: the session first, then wait for the spec
        settings = json.loads(argv[1])
        spark = _session(settings, "sparkeos-job")
        spec_path = ahead.wait_for_spec()
        if spec_path is None:
            return end_job(spark)
        spec = _load_spec(spec_path)
        if ahead.session_settings(spec) != settings:
            raise RuntimeError(f"{spec_path} needs another session than {settings}")
    else:
        spec = _load_spec(argv[0])
        spark = _session(ahead.session_settings(spec), f"sparkeos-job-{spec.name}")
    run_spec(spec, spark)
    return end_job(spark)


def end_job(spark: Any) -> int:
    """End a job process whose queries have stopped. Their output, Spark's checkpoint
    and the commit log are durable by then, so a classic driver's JVM is killed rather
    than stopped gracefully: a second saved per job, and a test run ends hundreds of
    jobs (to the protocol this is one more driver crash after the batches finished).
    Under Connect the session is stopped (its server is this job's child)."""
    from sparkeos.core.streaming.spark import is_connect

    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None) \
        if not is_connect(spark) else None
    if proc is None:
        spark.stop()
        return 0
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    proc.kill()
    proc.wait()
    os._exit(0)


def await_query(query: Any, timeout: float | None, what: str) -> None:
    """Wait for a query to end; one still running after ``timeout`` seconds is stopped
    and a ``TimeoutError`` raised (in a process that goes on, a query must not outlive
    its job)."""
    try:
        if not query.awaitTermination(timeout) and timeout is not None:
            raise TimeoutError(f"{what} still running after {timeout:.0f} s")
    finally:
        query.stop()  # a no-op once it ended


def run_spec(spec: JobSpec, spark: Any, timeout: float | None = None) -> int:
    """Run the job ``spec`` describes on ``spark`` until its input is consumed (the
    session stays open: ``end_job`` ends it); a query still running after ``timeout``
    seconds is stopped and a ``TimeoutError`` raised."""
    settings = dict(spec.settings)
    # The kill matrix reads what is visible right after a kill, so a job overlaps its
    # commits only where a case asks for it (its own cases kill inside the overlap);
    # the default (on, in a classic session) is the examples' (their own scripts).
    settings.setdefault("overlap_commits", False)
    if spec.connect and not spec.session_checkpoint:
        settings.setdefault("checkpoint_location", spec.checkpoint)
    if spec.session_checkpoint:
        spark.conf.set(SESSION_CHECKPOINT, spec.checkpoint)
        try:
            return _run_spec(spec, spark, settings, timeout)
        finally:
            spark.conf.unset(SESSION_CHECKPOINT)  # the warm session serves other jobs
    return _run_spec(spec, spark, settings, timeout)


SESSION_CHECKPOINT = "spark.sql.streaming.checkpointLocation"


def _run_spec(spec: JobSpec, spark: Any, settings: dict[str, Any],
              timeout: float | None) -> int:
    from sparkeos.core.streaming.adapter import with_guarantee

    df = (spark.readStream.schema(INPUT_SCHEMA)
          .option("maxFilesPerTrigger", spec.max_files_per_trigger).json(spec.input))
    if spec.partitions:
        df = df.repartition(spec.partitions)
    if spec.route == "format":
        return run_format_spec(spec, spark, df, timeout)
    factory = load_factory(spec.sink["factory"])
    target = factory(**spec.sink.get("kwargs", {}))
    ship_to_workers(factory, target)
    batch_fn: Callable[[Any, int], None]
    if spec.mode == "plain":
        batch_fn = crash_after_write(target)
    elif spec.mode == "function":
        batch_fn = target
    else:
        batch_fn = with_guarantee(target, spec.name, spec.mode, **settings)
    writer = df.writeStream.foreachBatch(batch_fn)
    if not spec.session_checkpoint:
        writer = writer.option("checkpointLocation", spec.checkpoint)
    query = writer.trigger(availableNow=True).start()
    try:
        await_query(query, timeout, f"job {spec.name}")
        flush = getattr(batch_fn, "flush", None)
        if callable(flush):
            flush()  # overlap_commits: the last batch may still be committing
    finally:
        close = getattr(target, "close", None)
        if callable(close):
            close()  # a process would have dropped its clients and pools by exiting
    recorded = getattr(batch_fn, "metrics", None)
    if spec.metrics_file and recorded is not None:
        metrics = [m.as_dict() for m in recorded]
        with open(spec.metrics_file, "w") as fh:
            json.dump(metrics, fh)
    return 0


def format_options(spec: JobSpec) -> dict[str, str]:
    """The options of a format-route job: the sink's, the query's checkpoint, and the
    spec's name, guarantee and coordinator settings as ``sparkeos.*`` options."""
    from sparkeos.core.streaming.streamformat import SETTINGS

    options = {str(k): str(v) for k, v in spec.sink.get("options", {}).items()}
    if not spec.session_checkpoint:
        options["checkpointLocation"] = spec.checkpoint
    options["sparkeos.name"] = spec.name
    options["sparkeos.guarantee"] = spec.mode
    by_field = {field: option for option, (field, _kind) in SETTINGS.items()}
    for key, value in spec.settings.items():
        if key in by_field:
            options[f"sparkeos.{by_field[key]}"] = str(value)
    return options


def run_format_spec(spec: JobSpec, spark: Any, df: Any, timeout: float | None) -> int:
    """``run_spec`` through the sink's format: ``df.writeStream.format(...)``. A classic
    session finds the formats as a user's does, through Spark's discovery of the
    installed ``pyspark_sparkeos_*`` modules (and saves a second per run); a Connect
    session proves ``sparkeos.register``, called from the client."""
    if spec.connect or spec.register_formats:
        import sparkeos

        sparkeos.register(spark)
    if spec.sink.get("select"):
        df = df.selectExpr(*spec.sink["select"])
    query = (df.writeStream.format(spec.sink["format"]).options(**format_options(spec))
             .trigger(availableNow=True).start())
    await_query(query, timeout, f"job {spec.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
