"""Where an object store is, as Spark's Hadoop connectors are told: one setting for
Spark's checkpoint and for sparkeos, in every process that writes.

A user points Spark's S3A (or the GCS connector) at a store with session settings
(``spark.hadoop.fs.s3a.endpoint``, ``spark.hadoop.fs.s3a.bucket.<b>.endpoint``,
``...endpoint.region``, ``...connection.ssl.enabled``, ``spark.hadoop.fs.gs.storage.
root.url``). sparkeos reads the same settings (``find_setting``), from the first
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

**Per-bucket settings, as Hadoop reads them.** S3A resolves a bucket's options by
looking up ``fs.s3a.bucket.<bucket>.`` + the option for the bucket it opens, over the
generic ``fs.s3a.`` + the option (``S3AUtils.propagateBucketOptions``); it never parses
a bucket out of a key, so a bucket named ``my.data`` has ``fs.s3a.bucket.my.data.
endpoint``. ``s3a_setting(bucket, option)`` does the same. What a format may carry is
decided without a bucket at hand: any ``fs.s3a.bucket.<...>.<location option>``.

**Carried settings belong to the block that carries them.** A ``using`` block's
settings are seen by the thread (the context) that opened it and by what that thread
runs in a copy of its context (``contextvars``: phase 2's commit threads, a task's
lease renewal); blocks nest, and each one ends by restoring exactly what was there
before it, even when blocks of two queries open and close interleaved in one process.
A thread started without a copy of any context (a library's own pool) sees the blocks
open in the process only where they agree, and is refused where two disagree: it cannot
tell which query it works for.

Only locations are read, never credentials (``*.access.key``, ``*.secret.key``...):
those come from the environment of each process, as boto3 and Google's and Azure's
clients read them.
"""

from __future__ import annotations

import contextvars
import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sparkeos.core.errors import ConfigurationError

SPARK_PREFIX = "spark.hadoop."
S3A_PREFIX = "fs.s3a."
S3A_BUCKET_PREFIX = "fs.s3a.bucket."
"""Hadoop's ``FS_S3A_BUCKET_PREFIX``: ``fs.s3a.bucket.<bucket>.<option>``."""
S3A_LOCATIONS = ("endpoint", "endpoint.region", "connection.ssl.enabled",
                 "path.style.access")
"""The S3A options (after ``fs.s3a.``) that say where a store is."""
GCS_LOCATIONS = ("fs.gs.storage.root.url",)
SESSION = "the Spark session"
CARRIED = "the settings the format carries (its options, or sparkeos.register)"
TASK = "the Spark task's properties"

_own: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "sparkeos_store_settings", default=None)
"""The settings of the innermost ``using`` block of this context (outer ones merged)."""
_open: dict[int, Mapping[str, str]] = {}
"""Every ``using`` block open in this process, for threads that have none of their own."""
_tokens = itertools.count()
_lock = threading.Lock()


@dataclass(frozen=True)
class Found:
    """A setting's value and where it was found."""

    name: str
    """Without ``spark.hadoop.``: ``fs.s3a.bucket.lake.endpoint``."""
    value: str
    place: str

    def describe(self) -> str:
        return f"spark.hadoop.{self.name} (from {self.place})"


def is_location_setting(name: str) -> bool:
    """Whether ``name`` (``fs.s3a.endpoint``, without ``spark.hadoop.``) says where a
    store is (and is no secret): a generic S3A location option, one for a bucket
    (``fs.s3a.bucket.<bucket>.<option>``, the bucket dotted or not), or GCS's root URL."""
    if name in GCS_LOCATIONS:
        return True
    if not name.startswith(S3A_PREFIX):
        return False
    if name[len(S3A_PREFIX):] in S3A_LOCATIONS:
        return True
    if not name.startswith(S3A_BUCKET_PREFIX):
        return False
    per_bucket = name[len(S3A_BUCKET_PREFIX):]
    return any(per_bucket.endswith("." + option) and len(per_bucket) > len(option) + 1
               for option in S3A_LOCATIONS)


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
    """Within the block, ``find_setting`` falls back to ``settings`` (a format's), over
    those of the blocks around it in this context."""
    outer = _own.get() or {}
    mine: Mapping[str, str] = MappingProxyType({**outer, **settings})
    with _lock:
        token = next(_tokens)
        _open[token] = mine
    reset = _own.set(mine)
    try:
        yield
    finally:
        _own.reset(reset)
        with _lock:
            del _open[token]


def find_setting(name: str) -> Found | None:
    """``spark.hadoop.<name>`` from the active session, else the settings carried here,
    else the running Spark task's local properties; None where none has it."""
    key = SPARK_PREFIX + name
    value = _session_setting(key)
    if value is not None:
        return Found(name, value, SESSION)
    value = _carried(name)
    if value:
        return Found(name, value, CARRIED)
    value = _task_property(key)
    if value is not None:
        return Found(name, value, TASK)
    return None


def hadoop_setting(name: str) -> str | None:
    """The value ``find_setting`` finds."""
    found = find_setting(name)
    return found.value if found else None


def s3a_setting(bucket: str, option: str) -> Found | None:
    """S3A's ``option`` (``endpoint``) for ``bucket``, as Hadoop resolves it: the
    bucket's own ``fs.s3a.bucket.<bucket>.<option>``, else ``fs.s3a.<option>``."""
    return (find_setting(f"{S3A_BUCKET_PREFIX}{bucket}.{option}")
            or find_setting(S3A_PREFIX + option))


def carry_fix(names: Sequence[str]) -> str:
    """How to give the processes of a format the settings ``names`` (without
    ``spark.hadoop.``): Spark gives them no session."""
    options = " or ".join(f'.option("spark.hadoop.{n}", ...)' for n in names)
    return (f"{options} on writeStream; or set spark.hadoop.{names[0]} in the session and "
            "call sparkeos.register(spark) after it, so the formats carry it (a format "
            "Spark found by itself carries no setting: Spark gives its planner, committer "
            "and tasks no session)")


def captured_from(spark: Any) -> dict[str, str]:
    """The location settings of a session (classic or Spark Connect), for a format to
    carry where there is no session."""
    try:
        everything = dict(spark.conf.getAll)
    except Exception:  # an old client without getAll: the generic names only
        everything = {}
        for name in (*(S3A_PREFIX + o for o in S3A_LOCATIONS), *GCS_LOCATIONS):
            try:
                value = spark.conf.get(SPARK_PREFIX + name, None)
            except Exception:
                value = None
            if value:
                everything[SPARK_PREFIX + name] = value
    return location_settings(everything)


def _carried(name: str) -> str | None:
    own = _own.get()
    if own is not None:
        return own.get(name)
    with _lock:
        found = {s.get(name) or None for s in _open.values()}
    if len(found) > 1:  # a block without the setting differs from one with it
        values = sorted(str(v) if v else "(none)" for v in found)
        raise ConfigurationError(
            f"this thread runs outside the format calls of this process, and two of them "
            f"carry different values of spark.hadoop.{name} ({', '.join(values)}): it "
            "cannot tell which query it works for",
            fix="run the work in the thread of the format call, or start its thread in a "
            "copy of that thread's context (contextvars.copy_context().run); this is a "
            "bug of the code that started the thread: please report it")
    return next(iter(found), None)


def _session_setting(key: str) -> str | None:
    try:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
        value = session.conf.get(key, None) if session else None
    except Exception:  # no pyspark, no session, or one that cannot answer
        return None
    return str(value) if value else None


def _task_property(key: str) -> str | None:
    from sparkeos.core.config import task_property

    return task_property(key)


__all__ = ["Found", "captured_from", "carry_fix", "find_setting", "hadoop_setting",
           "is_location_setting", "location_settings", "s3a_setting", "using"]
