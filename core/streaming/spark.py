"""Everything that touches Spark: sessions, the batch runner, query identity."""

from __future__ import annotations

import json
import os
import pickle
import re
import struct
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import ConfigurationError, SparkStoppedError
from sparkeos.core.snapshot.tasks import TaskAttempt, TaskFunction, TaskResult

from .workerpath import steady_spark_archives

QUERY_ID_PROPERTY = "sql.streaming.queryId"
RUN_ID_PROPERTY = "spark.jobGroup.id"
"""Spark runs every job of a streaming query run in a job group named by its run ID."""
_RESULT_SCHEMA = "partition long, result string"
_TASK_RESULT = pa.schema([("partition", pa.int64()), ("result", pa.string())])
_TASK_ITEM = pa.schema([("index", pa.int64()), ("result", pa.binary())])


def _one_row(schema: pa.Schema, number: int, data: bytes) -> pa.RecordBatch:
    """A task's one-row answer (an int64 and a string or binary column), built from
    buffers: ``pa.array`` and ``RecordBatch.from_pylist`` import pandas on their first
    call (pyarrow looks for pandas objects), 0.5 s of a core in every fresh Python
    worker that writes nothing else through them."""
    numbers = pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(struct.pack("=q", number))])
    offsets = pa.py_buffer(struct.pack("=ii", 0, len(data)))
    column = pa.Array.from_buffers(schema.field(1).type, 1, [None, offsets, pa.py_buffer(data)])
    return pa.RecordBatch.from_arrays([numbers, column], schema=schema)


def is_connect(obj: Any) -> bool:
    """True for a Spark Connect DataFrame or session: no ``rdd``, ``SparkContext`` or
    JVM there, only the DataFrame API (``foreachBatch`` runs the function in a
    server-side Python process)."""
    return type(obj).__module__.startswith("pyspark.sql.connect")


def default_writers(session: Any) -> int:
    """The cores the query's executors have: Spark's ``defaultParallelism``. Spark
    Connect has no ``SparkContext``: its configuration answers (the default
    parallelism if set, else the cores of a ``local[N]`` master or of the configured
    executors), else 2; set ``writers=`` where that is wrong."""
    if not is_connect(session):
        return max(1, int(session.sparkContext.defaultParallelism))

    def conf(key: str) -> str | None:
        try:
            value = session.conf.get(key, None)
        except Exception:  # an unknown key on an old server
            return None
        return str(value) if value not in (None, "") else None

    explicit = conf("spark.default.parallelism")
    if explicit and explicit.isdigit():
        return max(1, int(explicit))
    master = conf("spark.master") or ""
    local = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master)
    if local:
        cores = local.group(1)
        return (os.cpu_count() or 1) if cores == "*" else int(cores or 1)
    instances, cores = conf("spark.executor.instances"), conf("spark.executor.cores")
    if instances and cores and instances.isdigit() and cores.isdigit():
        return max(1, int(instances) * int(cores))
    return 2


def ensure_python_workers() -> None:
    """Make Spark's Python workers use this interpreter (and so its packages).

    Without it Spark starts workers with the system ``python3``, which lacks the
    virtual environment's packages and fails with "No module named 'pyarrow'".
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


SESSION_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.streaming.stopGracefullyOnShutdown": "false",
    "spark.driver.memory": "2g",
}
"""Small defaults for the local sessions of tests, demos and benchmarks."""
CDS_ENV = "SPARKEOS_SPARK_CDS"
"""A JVM class-data archive for the driver of local sessions (``sparkeos.testing.cds``):
used when the file exists, ignored by the JVM when it does not fit."""


def class_archive_options() -> str:
    """The driver JVM's options that map Spark's classes from the archive named by
    ``$SPARKEOS_SPARK_CDS``; empty when there is none."""
    archive = os.environ.get(CDS_ENV, "")
    if not archive or not os.path.exists(archive):
        return ""
    return f"-XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


def _with_class_archive(conf: dict[str, str]) -> dict[str, str]:
    shared = class_archive_options()
    options = conf.get("spark.driver.extraJavaOptions", "")
    if not shared or "SharedArchiveFile" in options or "ArchiveClassesAtExit" in options:
        return conf
    return {**conf, "spark.driver.extraJavaOptions": f"{options} {shared}".strip()}


def local_session(app_name: str = "sparkeos", master: str = "local[2]",
                  conf: dict[str, str] | None = None) -> Any:
    """A local SparkSession with small defaults suited to tests, demos and benchmarks."""
    ensure_python_workers()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in SESSION_DEFAULTS.items():
        builder = builder.config(key, value)
    if master.startswith("spark://127.") or master.startswith("spark://localhost"):
        # A cluster on this machine's loopback (the tests' standalone cluster): the
        # executors reach the driver there.
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    for key, value in _with_class_archive(dict(conf or {})).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def session_settings(session: Any, names: Sequence[str]) -> dict[str, str]:
    """The settings among ``names`` that ``session`` (classic or Spark Connect) sets."""
    found = {}
    for name in names:
        value = session.conf.get(name, None)
        if value is not None:
            found[name] = str(value)
    return found


SPARK_SCHEMA_KEY = b"sparkeos.spark_schema"
"""In the Arrow schema a sink is given: the batch's Spark schema (``StructType.json()``),
for sinks that write what Spark's own writer writes from it (the file sink's Parquet)."""


def batch_arrow_schema(schema: Any) -> pa.Schema:
    """A batch's Spark schema as its sinks see it and the commit log records it (both
    routes): Arrow's types, timestamps in UTC (they reach tasks in the session's time
    zone; a change of that setting is no schema change), and the Spark schema itself
    under ``SPARK_SCHEMA_KEY``."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC").with_metadata(
        {SPARK_SCHEMA_KEY: schema.json()})


class SparkBatchRunner:
    """Runs phase-1 tasks over a foreachBatch DataFrame with ``mapInArrow``.

    Arrow moves each partition to Python in columnar batches, so a sink writes at
    close to the speed of Spark's own writers.
    """

    def __init__(self, df: Any, cluster_by: Sequence[str] = (),
                 writers: int | None = None, columns: Sequence[str] = ()) -> None:
        self._schema_df = df
        limit = writers or default_writers(df.sparkSession)
        if cluster_by and set(cluster_by) <= set(df.columns):  # else the sink refuses
            # Rows with equal keys in one partition: hash partitioning is a function of
            # the key, so every task attempt of a partition sees the same rows.
            df = df.repartition(limit, *cluster_by)
        else:
            # Each partition is a participant with fixed costs (a transaction, a staged
            # file, a producer): a 200-partition batch is written by ``limit`` of them.
            # coalesce groups parent partitions without a shuffle, fixed for the job, so
            # every attempt of a participant sees the same rows; a batch with fewer
            # partitions keeps them. ``limit`` is an upper bound known without planning
            # the batch (``df.rdd.getNumPartitions()`` costs a query planning).
            df = df.coalesce(limit)
        self._df = df.selectExpr(*columns) if columns else df
        self._partitions = limit

    def partitions(self) -> int:
        return self._partitions

    def arrow_schema(self) -> pa.Schema:
        return batch_arrow_schema(self._schema_df.schema)

    def run_tasks(self, task: TaskFunction) -> list[TaskResult]:
        # Attempt tokens must differ across applications (stage and task IDs restart).
        session = self._df.sparkSession
        app_id = (uuid.uuid4().hex if is_connect(session)
                  else session.sparkContext.applicationId)

        def run_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            steady_spark_archives()
            ctx = TaskContext.get()
            assert ctx is not None
            attempt = TaskAttempt(
                partition=ctx.partitionId(), attempt_number=ctx.attemptNumber(),
                token=f"{app_id}-s{ctx.stageId()}-t{ctx.taskAttemptId()}")
            result = task(attempt, batches)
            yield _one_row(_TASK_RESULT, ctx.partitionId(), json.dumps(result).encode())

        rows = self._df.mapInArrow(run_partition, _RESULT_SCHEMA).collect()
        return [json.loads(row["result"]) for row in rows]

    def run_in_tasks(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        return run_in_tasks(self._df.sparkSession, fn, items)

    def run_without_output(self) -> None:
        # Spark checks that every state store of a stateful query committed for each
        # batch (STATE_STORE_COMMIT_VALIDATION_FAILED otherwise): run the whole plan.
        self._df.write.format("noop").mode("overwrite").save()


def run_in_tasks(session: Any, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``fn`` of each item, one Spark task per item, in classic mode and under Connect.
    ``SparkStoppedError`` when the session's context stopped before or under the job."""
    def run(item: Any) -> Any:
        steady_spark_archives()
        return fn(item)

    if not is_connect(session):
        try:
            sc = session.sparkContext
            return list(sc.parallelize(list(items), len(items)).map(run).collect())
        except Exception as exc:
            if not context_stopped(session):
                raise
            raise SparkStoppedError(
                f"Spark's context stopped (spark.stop(), or the application ended) before "
                f"{len(items)} tasks of this driver could all run", fix="stop the queries "
                "(query.stop()) before the session; a decided batch is finished by the "
                "driver's process, other work by the query's restart") from exc
    # No parallelize under Connect: one task per item over a range, the item taken
    # from the function's own copy of the list.
    work = list(items)

    def run_range(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield _one_row(_TASK_ITEM, index, pickle.dumps(run(work[index])))

    rows = (session.range(0, len(work), 1, len(work))
            .mapInArrow(run_range, "index long, result binary").collect())
    return [pickle.loads(row["result"]) for row in sorted(rows, key=lambda r: r["index"])]


def context_stopped(session: Any) -> bool:
    """Whether the SparkContext of a classic session stopped, from Python or in the JVM
    (never under Spark Connect, which has none here)."""
    if is_connect(session):
        return False
    jsc = getattr(session.sparkContext, "_jsc", None)
    if jsc is None:  # stopped through pyspark
        return True
    try:
        return bool(jsc.sc().isStopped())
    except Exception:  # the JVM itself is gone
        return True


def runs_on_one_host(session: Any) -> bool:
    """The executors are the driver's own JVM (a ``local`` master): every path the
    driver sees, they see."""
    if is_connect(session):
        try:
            master = str(session.conf.get("spark.master", "") or "")
        except Exception:
            return False
    else:
        master = str(session.sparkContext.master)
    return master.startswith("local")


def running_query(df: Any) -> tuple[str | None, str | None]:
    """(query id, run id) of the query running this foreachBatch: Spark sets both as
    local properties of the thread that calls foreachBatch. None outside a query."""
    if is_connect(df):
        return None, None  # no local properties there; see checkpoint_query_id()
    context = df.sparkSession.sparkContext
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
    if not query_id:
        return None, None
    return query_id, context.getLocalProperty(RUN_ID_PROPERTY)


def query_checkpoint(df: Any, query_id: str | None) -> str | None:
    """The resolved checkpoint root of the running query ``query_id``, read from the
    JVM (a few py4j round trips: once per query run, not per batch)."""
    if not query_id or is_connect(df):
        return None
    return query_checkpoint_in(df.sparkSession, query_id)


def query_checkpoint_in(session: Any, query_id: str) -> str | None:
    """``query_checkpoint`` from a classic session (any: the query is looked up in the
    JVM's default session)."""
    jvm = session.sparkContext._jvm
    for cls in ("org.apache.spark.sql.classic.SparkSession", "org.apache.spark.sql.SparkSession"):
        try:
            holder = jvm
            for part in cls.split("."):
                holder = getattr(holder, part)
            default = holder.getDefaultSession()
            if not default.isDefined():
                continue
            query = default.get().streams().get(query_id)
            if query is not None:
                # Hadoop's Path string (``file:/tmp/ckpt#1``), read by core.storage.locations.
                return str(query.streamingQuery().resolvedCheckpointRoot())
        except Exception:
            continue
    return None


def query_activity(df: Any, query_id: str | None,
                   run_id: str | None) -> Callable[[], bool] | None:
    """A callable telling whether the query run ``run_id`` of ``query_id`` is still
    active, or None when that cannot be asked. Classic: the JVM's default session (the
    batch DataFrame's session is a clone, whose query manager knows no query); a query
    started from another session cannot be found there, and None is returned. Under
    Spark Connect: the server's session, through the foreachBatch process's own."""
    if not query_id:
        return None
    if is_connect(df):
        session = df.sparkSession
        try:
            if session.streams.get(query_id) is None:
                return None  # not a query this session knows: the lease lives with us
        except Exception:
            return None

        def connect_active() -> bool:
            query = session.streams.get(query_id)
            return query is not None and bool(query.isActive)

        return connect_active
    jvm = df.sparkSession.sparkContext._jvm

    def lookup() -> Any:
        for cls in ("org.apache.spark.sql.classic.SparkSession",
                    "org.apache.spark.sql.SparkSession"):
            try:
                holder = jvm
                for part in cls.split("."):
                    holder = getattr(holder, part)
                default = holder.getDefaultSession()
            except Exception:
                continue
            if default.isDefined():
                return default.get().streams().get(query_id)
        return None

    try:
        if lookup() is None:
            return None
    except Exception:
        return None

    def classic_active() -> bool:
        query = lookup()
        return (query is not None and bool(query.isActive())
                and (run_id is None or str(query.runId().toString()) == run_id))

    return classic_active


def checkpoint_query_id(location: str) -> str | None:
    """The query ID Spark keeps in ``<checkpoint>/metadata`` (``{"id": ...}``), the
    same ID a running query reports; None before the query first started there or on
    a file system sparkeos does not reach from Python."""
    from sparkeos.core.errors import ConfigurationError
    from sparkeos.core.storage.registry import split_uri

    try:
        files, path = split_uri(location)
        text = files.read(f"{path.rstrip('/')}/metadata").decode()
        value = json.loads(text.splitlines()[0]).get("id")
    except (ConfigurationError, OSError, ValueError, AttributeError, IndexError):
        return None
    return str(value) if value else None


def connect_session(app_name: str = "sparkeos", master: str = "local[2]",
                    conf: dict[str, str] | None = None) -> Any:
    """A Spark Connect session: ``sc://host:port`` reaches a running Connect server;
    ``local[N]`` starts one on this machine (pyspark ships it; ``sparkeos[connect]``
    brings the client's gRPC packages), with the defaults of ``local_session``."""
    ensure_python_workers()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(master).appName(app_name)
    if not master.startswith("sc://"):
        for key, value in _with_class_archive({**SESSION_DEFAULTS, **(conf or {})}).items():
            builder = builder.config(key, value)
    import warnings

    with warnings.catch_warnings():
        # The local server starts with every setting; the client then also tries them
        # as runtime settings and warns about the static ones.
        warnings.filterwarnings("ignore", message="Failed to set", category=UserWarning)
        return builder.getOrCreate()


def is_temporary_checkpoint(location: str) -> bool:
    """Spark invents ``.../temporary-<uuid>`` when no checkpointLocation was set."""
    return os.path.basename(location.rstrip("/")).startswith("temporary-")


def require_durable_checkpoint(location: str | None, sink: str) -> str:
    if location is None or is_temporary_checkpoint(location):
        raise ConfigurationError(
            "the streaming query has no checkpointLocation"
            + (f" (Spark uses the temporary {location})" if location else ""),
            sink=sink,
            fix='set .option("checkpointLocation", "<durable path>") on writeStream, or pass '
            "checkpoint_location= to exactly_once(); exactly-once needs a checkpoint that "
            "survives restarts",
        )
    return location
