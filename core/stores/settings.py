"""Where an object store is, as Spark's Hadoop connectors are told: one setting for
Spark's checkpoint and for sparkeos, in every process that writes.

A user points Spark's S3A (or the GCS connector) at a store with session settings
(``spark.hadoop.fs.s3a.endpoint``, ``spark.hadoop.fs.s3a.bucket.<b>.endpoint``,
``...endpoint.region``, ``...connection.ssl.enabled``, ``spark.hadoop.fs.gs.storage.
root.url``). sparkeos reads the same settings (``hadoop_setting``), from the first
place that has them:

1. the active Spark session of this process (the driver of ``foreachBatch``);
2. the settings a format carries (``using``): captured from the session when
   ``sparkeos.register(spark)`` registered the formats, or given as options of the
   same names (``.option("spark.hadoop.fs.s3a.endpoint", ...)``). Spark gives a Python
   data source's planner and committer no session and none of its settings (measured
   on Spark 4.3: only the writer's options arrive, and ``spark.executorEnv.*`` only for
   a source registered from Python), so the format route needs this;
3. a Spark task's local properties, where Spark puts every session setting while it
   runs a query (the tasks of either route).

Only locations are read, never credentials (``*.access.key``, ``*.secret.key``...):
those come from the environment of each process, as boto3 and Google's and Azure's
clients read them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

SPARK_PREFIX = "spark.hadoop."
_LOCATION = re.compile(
    r"^fs\.(s3a\.(bucket\.[^.]+\.)?(endpoint|endpoint\.region|connection\.ssl\.enabled|"
    r"path\.style\.access)|gs\.storage\.root\.url)$")
_carried: dict[str, str] = {}
"""The settings of the ``using`` blocks open in this process: process-wide, so the
threads a block starts (phase 2's commit threads) see them too. A Python worker runs one
Spark call at a time."""
_lock = threading.Lock()


def is_location_setting(name: str) -> bool:
    """Whether ``name`` (``fs.s3a.endpoint``, without ``spark.hadoop.``) says where a
    store is (and is no secret)."""
    return bool(_LOCATION.match(name))


def location_settings(settings: Mapping[str, Any]) -> dict[str, str]:
    """The location settings among ``settings`` (keys with or without ``spark.hadoop.``,
    any case for the prefix), keyed without the prefix."""
    found: dict[str, str] = {}
    for key, value in settings.items():
        name = str(key)
        if name.lower().startswith(SPARK_PREFIX):
            name = name[len(SPARK_PREFIX):]
        if is_location_setting(name) and value is not None:
            found[name] = str(value)
    return found


@contextmanager
def using(settings: Mapping[str, str]) -> Iterator[None]:
    """Within the block, ``hadoop_setting`` falls back to ``settings`` (a format's)."""
    with _lock:
        previous = dict(_carried)
        _carried.update(settings)
    try:
        yield
    finally:
        with _lock:
            _carried.clear()
            _carried.update(previous)


def hadoop_setting(name: str) -> str | None:
    """``spark.hadoop.<name>`` from the active session, else the settings carried here,
    else the running Spark task's local properties; None where none has it."""
    key = SPARK_PREFIX + name
    value = _session_setting(key)
    if value is None:
        value = _carried.get(name)
    if value is None:
        value = _task_property(key)
    return str(value) if value else None


def captured_from(spark: Any) -> dict[str, str]:
    """The location settings of a session (classic or Spark Connect), for a format to
    carry where there is no session."""
    try:
        everything = dict(spark.conf.getAll)
    except Exception:  # an old client without getAll: the common names only
        everything = {}
        for name in ("fs.s3a.endpoint", "fs.s3a.endpoint.region",
                     "fs.s3a.connection.ssl.enabled", "fs.s3a.path.style.access",
                     "fs.gs.storage.root.url"):
            try:
                value = spark.conf.get(SPARK_PREFIX + name, None)
            except Exception:
                value = None
            if value:
                everything[SPARK_PREFIX + name] = value
    return location_settings(everything)


def _session_setting(key: str) -> str | None:
    try:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
        value = session.conf.get(key, None) if session else None
    except Exception:  # no pyspark, no session, or one that cannot answer
        return None
    return str(value) if value else None


def _task_property(key: str) -> str | None:
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        value = context.getLocalProperty(key) if context is not None else None
    except Exception:
        return None
    return str(value) if value else None


__all__ = ["captured_from", "hadoop_setting", "is_location_setting", "location_settings",
           "using"]
