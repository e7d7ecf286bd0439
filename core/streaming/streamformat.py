"""``df.writeStream.format("sparkeos-...")``: a sink as a Spark Python data source.

A connector offers its sink as a format by subclassing ``SinkFormat``: a format name
and ``make_sink(options)``, which turns Spark-style options into its sink. Everything
else is here: the options every format shares (``checkpointLocation``, the
``sparkeos.*`` settings), and the streaming writer that runs the protocol through
``core.streaming.formatbatch`` in the three places Spark calls it:

* ``streamWriter()`` when Spark plans a batch: recovery, the checks, ``begun``;
* ``write()`` in every task: phase 1, the receipt as the commit message;
* ``commit()`` / ``abort()`` after the tasks: the decision and phase 2, or the roll back.

Spark calls ``streamWriter()`` a second time in the process that commits, before
``commit``; there it must not begin another run. The two calls differ by where the data
source object comes from, on every pyspark the package supports (4.2 and 4.3): the
planner makes it from the class and the options, the commit worker is sent the instance
the driver made, pickled. ``SinkFormat.__setstate__`` marks such an instance, and a
writer checks both ends: one shipped to the tasks without a plan, or a commit through a
writer that planned, fails with ``UnsupportedSparkError`` before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import ConfigurationError, UnsupportedSparkError
from sparkeos.core.storage.stores import settings as store_settings

from .sparkversion import check_pyspark
from .workerpath import steady_spark_archives

if TYPE_CHECKING:  # imported where used: Spark imports a format where it needs only the class
    import pyarrow as pa

    from sparkeos.core.protocol import TransactionalSink

    from .formatbatch import FormatQuery, PlannedBatch

try:  # pyspark >= 4.2; the module imports without it (the CLI, connectors' own tests)
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )
except ImportError:  # pragma: no cover - pyspark is a dependency
    DataSource = DataSourceStreamArrowWriter = WriterCommitMessage = object  # type: ignore

T = TypeVar("T")
PREFIX = "sparkeos."
DEFAULT_SINK_NAME = "sink"
DEFAULT_MAX_PARTITIONS = 200
"""Spark's default ``spark.sql.shuffle.partitions``: the partition count of most
streaming aggregations."""
SPARK_OPTIONS = frozenset({"checkpointlocation", "path", "queryname"})
"""Options Spark itself may pass to every format; a format that has no use for them
ignores them."""
SETTINGS: dict[str, tuple[str, Any]] = {
    "guarantee": ("guarantee", str),
    "taskattempts": ("task_attempts", int),
    "retainbatches": ("retain_batches", int),
    "commitparallelism": ("commit_parallelism", int),
    "leasettlseconds": ("lease_ttl_s", float),
    "existingoutput": ("existing_output", str),
}
"""``sparkeos.<option>`` (any case) and the ``exactly_once(...)`` setting it sets."""
_Pairs = tuple[tuple[str, str], ...]
_MADE: dict[tuple[str, str, _Pairs, _Pairs, _Pairs],
            tuple[TransactionalSink[Any], FormatSettings]] = {}
_PARTITION_COLUMNS = "__partition_columns"


class Options:
    """A format's options (keys lower-cased, as Spark passes them): each read is
    remembered, and ``finish`` refuses the ones no reader took."""

    def __init__(self, options: Mapping[str, str], format_name: str) -> None:
        self._values = {str(k).lower(): str(v) for k, v in options.items()}
        self.format_name = format_name
        self._read: set[str] = set()

    def get(self, key: str, default: str | None = None) -> str | None:
        key = key.lower()
        self._read.add(key)
        return self._values.get(key, default)

    def require(self, key: str, example: str) -> str:
        value = self.get(key)
        if not value:
            raise ConfigurationError(
                f"the {self.format_name} format needs the option {key!r}",
                fix=f'.option("{key}", {example})')
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key)
        if value is None:
            return default
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise ConfigurationError(f"option {key}={value!r} of {self.format_name} is not "
                                 "true or false", fix=f'.option("{key}", "true")')

    def integer(self, key: str, default: int) -> int:
        return self._parsed(key, default, int, "a whole number", "8")

    def number(self, key: str, default: float) -> float:
        return self._parsed(key, default, float, "a number", "30")

    def _parsed(self, key: str, default: T, parse: Callable[[str], T], kind: str,
                example: str) -> T:
        value = self.get(key)
        if value is None:
            return default
        try:
            return parse(value)
        except ValueError:
            raise ConfigurationError(f"option {key}={value!r} of {self.format_name} is not "
                                     f"{kind}", fix=f'.option("{key}", "{example}")') from None

    def names(self, key: str) -> list[str] | None:
        """A comma-separated list of column names (``"id, day"``); None if not given."""
        value = self.get(key)
        if not value:
            return None
        return [name.strip() for name in value.split(",") if name.strip()]

    def sink_name(self) -> str:
        """``sparkeos.name``: the sink's name in the commit log and transaction IDs."""
        return self.get(PREFIX + "name") or DEFAULT_SINK_NAME

    def with_prefix(self, prefix: str) -> dict[str, str]:
        """Every option under ``prefix`` (e.g. ``kafka.``), the prefix removed."""
        found = {k[len(prefix):]: v for k, v in self._values.items() if k.startswith(prefix)}
        self._read.update(prefix + k for k in found)
        return found

    def finish(self) -> None:
        unknown = sorted(set(self._values) - self._read - SPARK_OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"the {self.format_name} format does not know the option(s) "
                f"{', '.join(unknown)}",
                fix="remove them or correct their names (docs/formats.md lists every "
                "option); nothing was written")


@dataclass(frozen=True)
class FormatSettings:
    """The options every sparkeos format shares."""

    config: CoordinatorConfig
    max_partitions: int

    @classmethod
    def read(cls, options: Options) -> FormatSettings:
        settings: dict[str, Any] = {}
        for option, (field, kind) in SETTINGS.items():
            value = options.get(PREFIX + option)
            if value is None:
                continue
            if kind is int:
                settings[field] = options.integer(PREFIX + option, 0)
            elif kind is float:
                settings[field] = options.number(PREFIX + option, 0.0)
            else:
                settings[field] = value
        config = CoordinatorConfig(
            name=options.sink_name(),
            checkpoint_location=options.get("checkpointLocation"),
            **settings)
        max_partitions = options.integer(PREFIX + "maxpartitions", DEFAULT_MAX_PARTITIONS)
        if not 1 <= max_partitions <= 100_000:
            raise ConfigurationError(
                f"sparkeos.maxPartitions={max_partitions} must be from 1 to 100000",
                sink=config.name, fix='.option("sparkeos.maxPartitions", "200")')
        if config.guarantee is Guarantee.EXACTLY_ONCE and not config.checkpoint_location:
            raise ConfigurationError(
                f"the {options.format_name} format needs the query's checkpointLocation as "
                "an option (Spark does not tell a Python sink where its checkpoint is)",
                sink=config.name,
                fix='.option("checkpointLocation", "<durable path>") on writeStream (not '
                "only spark.sql.streaming.checkpointLocation); nothing was written")
        return cls(config, max_partitions)


class SinkFormat(DataSource):  # type: ignore[misc, valid-type]
    """Base class of a connector's format: set ``format_name``, implement
    ``make_sink``. Register it with ``sparkeos.register(spark)`` (or
    ``spark.dataSource.register(cls)``)."""

    format_name: ClassVar[str] = ""
    store_locations: ClassVar[dict[str, str]] = {}
    """Where the object stores are (``fs.s3a.endpoint``...), captured from the session by
    ``sparkeos.register(spark)``: Spark gives the format's planner and committer no
    session (``core.storage.stores.settings``)."""
    session_settings: ClassVar[tuple[str, ...]] = ()
    """The Spark settings this format's sink follows as Spark's own sink of its kind
    does (``spark.sql.parquet.outputTimestampType``...). Spark gives a format no session:
    ``sparkeos.register(spark)`` captures their values in ``captured_settings``, and
    options of the same names win over those."""
    captured_settings: ClassVar[dict[str, str]] = {}
    complete_mode_appends: ClassVar[bool] = False
    """Whether ``outputMode("complete")`` is taken as Spark's own sink for the
    destination takes it: every batch's whole result table appended (a message
    broker). Otherwise complete mode, which would replace the output, is refused."""

    @classmethod
    def name(cls) -> str:
        return cls.format_name

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Only Spark's commit worker is sent a pickled data source (its planner makes
        # one from the class): a shipped instance commits and never plans.
        self.__dict__.update(state)
        self._shipped = True

    def make_sink(self, options: Options, schema: pa.Schema) -> TransactionalSink[Any]:
        """The connector's sink from its options (``options.get``/``require``...) and
        the stream's schema (which columns it has, as Spark's own sinks read them)."""
        raise NotImplementedError

    def _sink_and_settings(self, schema: pa.Schema
                           ) -> tuple[TransactionalSink[Any], FormatSettings]:
        """The sink and settings these options make: one sink object per process and
        configuration, as one foreachBatch adapter keeps its sink for the query run
        (Spark reuses its Python workers; a sink's own once-per-run state, such as the
        file sink's shared-directory mark, is not made again every batch)."""
        key = (self.format_name, str(schema), tuple(sorted(
            (str(k).lower(), str(v)) for k, v in self.options.items())),
            tuple(sorted(self.store_locations.items())),
            tuple(sorted(self.captured_settings.items())))
        made = _MADE.get(key)
        if made is None:
            made = _MADE[key] = self._make(schema)
        return made

    def _locations(self) -> dict[str, str]:
        """The store locations this format carries: those captured at registration, and
        options of the same names (``.option("spark.hadoop.fs.s3a.endpoint", ...)``)."""
        return {**self.store_locations, **store_settings.location_settings(self.options)}

    def _make(self, schema: pa.Schema) -> tuple[TransactionalSink[Any], FormatSettings]:
        options = Options(self.options, self.format_name)
        # Spark 4.3 never passes .partitionBy(...) to a Python sink (docs/formats.md);
        # should a later Spark pass it as its V1 sources get it, it is refused.
        columns = options.get(_PARTITION_COLUMNS)
        if columns not in (None, "", "[]"):
            raise ConfigurationError(
                f"the {self.format_name} format does not write partitioned directories "
                f"(partitionBy {columns})",
                fix='drop .partitionBy(...); the file formats lay their output out by '
                '.option("sparkeos.partitionBy", "col1,col2")')
        for key in self.options:
            if store_settings.location_settings({key: ""}):
                options.get(str(key))  # read by core.storage.stores.settings, not by the sink
        settings = FormatSettings.read(options)
        sink = self.make_sink(options, schema)
        options.finish()
        return sink, settings

    def streamWriter(self, schema: Any, overwrite: bool) -> FormatWriter:
        locations = self._locations()
        with store_settings.using(locations):
            writer = self._stream_writer(schema, overwrite)
        writer.locations = locations
        return writer

    def _stream_writer(self, schema: Any, overwrite: bool) -> FormatWriter:
        arrow = arrow_schema(schema)
        sink, settings = self._sink_and_settings(arrow)
        if overwrite and not self.complete_mode_appends:
            raise ConfigurationError(
                f"the {self.format_name} format appends: complete mode (which replaces the "
                "whole output every batch) is not supported",
                sink=settings.config.name,
                fix='use .outputMode("append"), or foreachBatch(exactly_once(...)); nothing '
                "was written")
        check_pyspark()
        from .formatbatch import FormatQuery

        query = FormatQuery(sink, settings.config, settings.max_partitions)
        planned = None if getattr(self, "_shipped", False) else query.plan(arrow)
        return FormatWriter(query, planned, arrow)


@dataclass
class PreparedPartition(WriterCommitMessage):  # type: ignore[misc, valid-type]
    """One task's commit message: its phase-1 result (small: the receipt, counts)."""

    result: dict[str, Any]


class FormatWriter(DataSourceStreamArrowWriter):  # type: ignore[misc, valid-type]
    """The streaming writer of one batch. Pickled to the tasks with the plan, never with
    the query's commit log (each process rebuilds what it needs)."""

    def __init__(self, query: FormatQuery | None, planned: PlannedBatch | None,
                 schema: pa.Schema) -> None:
        self.query, self.planned, self.schema = query, planned, schema
        self.locations: dict[str, str] = {}
        """The store locations its format carries (``core.storage.stores.settings``)."""

    def __getstate__(self) -> dict[str, Any]:
        if self.planned is None:  # Spark ships it to the tasks: it must hold a plan
            raise UnsupportedSparkError(_TELLS_PLAN_FROM_COMMIT)
        return {"query": None, "planned": self.planned, "schema": self.schema,
                "locations": self.locations}

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PreparedPartition:
        from pyspark import TaskContext

        from .formatbatch import run_task

        steady_spark_archives()
        ctx = TaskContext.get()
        assert ctx is not None and self.planned is not None
        with store_settings.using(getattr(self, "locations", {})):
            result = run_task(self.planned, ctx.partitionId(), ctx.attemptNumber(),
                              f"s{ctx.stageId()}-t{ctx.taskAttemptId()}", iterator,
                              ctx.getLocalProperty)
        return PreparedPartition(result)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        steady_spark_archives()
        assert self.query is not None
        if self.planned is not None:  # the commit worker began a run of its own
            raise UnsupportedSparkError(_TELLS_PLAN_FROM_COMMIT)
        results = [r for r in _results(messages) if r is not None]
        with store_settings.using(self.locations):
            self.query.commit(int(batchId), results, self.schema)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        assert self.query is not None
        with store_settings.using(self.locations):
            self.query.abort(int(batchId), _results(messages))


def _results(messages: list[WriterCommitMessage | None]) -> list[dict[str, Any] | None]:
    """The tasks' results (None for a task that failed)."""
    return [m.result if isinstance(m, PreparedPartition) else None for m in messages]


def arrow_schema(schema: Any) -> pa.Schema:
    """The batch's schema as the sink, the checks and the commit log see it, as on the
    foreachBatch route (``core.streaming.spark.batch_arrow_schema``)."""
    from .spark import batch_arrow_schema

    return batch_arrow_schema(schema)


_TELLS_PLAN_FROM_COMMIT = (
    "this pyspark does not call the streaming writer as sparkeos tells Spark's planning "
    "from its commit (a pickled data source commits, a new one plans); the batch was "
    "not committed, and the restart's recovery settles it")


__all__ = ["FormatSettings", "FormatWriter", "Options", "PreparedPartition", "SinkFormat"]
