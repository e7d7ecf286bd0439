"""Everything that touches Spark: sessions, the batch runner, query identity."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from .coordinator import TaskAttempt, TaskFunction, TaskResult
from .errors import ConfigurationError

QUERY_ID_PROPERTY = "sql.streaming.queryId"
RUN_ID_PROPERTY = "spark.jobGroup.id"
"""Spark runs every job of a streaming query run in a job group named by its run ID."""
_RESULT_SCHEMA = "partition long, result string"


def ensure_python_workers() -> None:
    """Make Spark's Python workers use this interpreter (and so its packages).

    Without it Spark starts workers with the system ``python3``, which lacks the
    virtual environment's packages and fails with "No module named 'pyarrow'".
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def local_session(app_name: str = "sparkeos", master: str = "local[2]",
                  conf: dict[str, str] | None = None) -> Any:
    """A local SparkSession with small defaults suited to tests, demos and benchmarks."""
    ensure_python_workers()
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "false")
        .config("spark.driver.memory", "2g")
    )
    if master.startswith("spark://127.") or master.startswith("spark://localhost"):
        # A cluster on this machine's loopback (the tests' standalone cluster): the
        # executors reach the driver there.
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


class SparkBatchRunner:
    """Runs phase-1 tasks over a foreachBatch DataFrame with ``mapInArrow``.

    Arrow moves each partition to Python in columnar batches, so a sink writes at
    close to the speed of Spark's own writers.
    """

    def __init__(self, df: Any, cluster_by: Sequence[str] = (),
                 writers: int | None = None, columns: Sequence[str] = ()) -> None:
        self._schema_df = df
        limit = writers or max(1, int(df.sparkSession.sparkContext.defaultParallelism))
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
        from pyspark.sql.pandas.types import to_arrow_schema

        # Timestamps reach tasks in the session time zone; the schema recorded in the
        # commit log uses UTC so that a time-zone setting change is not a schema change.
        try:
            return to_arrow_schema(self._schema_df.schema, timezone="UTC")
        except TypeError:  # pyspark < 4.1 has no timezone parameter
            return to_arrow_schema(self._schema_df.schema)

    def run_tasks(self, task: TaskFunction) -> list[TaskResult]:
        app_id = self._df.sparkSession.sparkContext.applicationId

        def run_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            assert ctx is not None
            attempt = TaskAttempt(
                partition=ctx.partitionId(), attempt_number=ctx.attemptNumber(),
                token=f"{app_id}-s{ctx.stageId()}-t{ctx.taskAttemptId()}")
            result = task(attempt, batches)
            yield pa.RecordBatch.from_pylist(
                [{"partition": ctx.partitionId(), "result": json.dumps(result)}],
                schema=pa.schema([("partition", pa.int64()), ("result", pa.string())]),
            )

        rows = self._df.mapInArrow(run_partition, _RESULT_SCHEMA).collect()
        return [json.loads(row["result"]) for row in rows]

    def run_in_tasks(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        sc = self._df.sparkSession.sparkContext
        return list(sc.parallelize(list(items), len(items)).map(fn).collect())

    def run_without_output(self) -> None:
        # Spark checks that every state store of a stateful query committed for each
        # batch (STATE_STORE_COMMIT_VALIDATION_FAILED otherwise): run the whole plan.
        self._df.write.format("noop").mode("overwrite").save()


def running_query(df: Any) -> tuple[str | None, str | None]:
    """(query id, run id) of the query running this foreachBatch: Spark sets both as
    local properties of the thread that calls foreachBatch. None outside a query."""
    context = df.sparkSession.sparkContext
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
    if not query_id:
        return None, None
    return query_id, context.getLocalProperty(RUN_ID_PROPERTY)


def query_checkpoint(df: Any, query_id: str | None) -> str | None:
    """The resolved checkpoint root of the running query ``query_id``, read from the
    JVM (a few py4j round trips: once per query run, not per batch)."""
    if not query_id:
        return None
    jvm = df.sparkSession.sparkContext._jvm
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
                return str(query.streamingQuery().resolvedCheckpointRoot())
        except Exception:
            continue
    return None


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
