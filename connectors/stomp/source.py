"""The acknowledging STOMP source: Jet's JMS source on Spark's Python streaming API.

A queue is not replayable: a message the broker delivered must be acknowledged once
the batch that holds it is committed, not before (it would be lost if the batch
failed) and not never (it would come again). The reader, in Spark's long-lived source
runner process:

``latestOffset(start)``
    1. acknowledges every message up to ``start`` (Spark calls it once the batch ending
       at ``start`` is committed, and after a restart with nothing new): ACK frames,
       confirmed by a RECEIPT, then their IDs are forgotten and their spool deleted;
    2. pulls up to ``max_batch_messages`` messages (``client-individual`` ack), drops
       those whose stable ID the seen-ID store holds (redeliveries), spools the rest
       durably with sequence numbers continuing from ``start``, records their IDs, and
       returns the last sequence number as the offset.

``partitions``/``read``
    executors read the spool, never the broker; a re-run batch reads the same rows.

``commit(end)``
    the same acknowledgement as step 1, up to ``end``.

A redelivery (the query died after the batch was committed but before the ACK, so the
broker sends the message again) is recognised by its stable ID: acknowledged at once if
its batch is committed, else its new ack handle is kept. Acknowledgements are never
sent inside a STOMP transaction (Artemis applies them at once; ABORT does not undo
them). The ``redelivered`` header is never used (brokers set it unreliably).

This module holds the settings and Spark's data source API; the runner process's
bookkeeping is ``runtime`` (with ``connection``, ``spool``, ``seen`` and ``messages``).
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from sparkeos.core.errors import ConfigurationError

from .client import Endpoint, redact_url
from .runtime import Runtime
from .spool import Pull, list_pulls, read_pulls

SPOOL_ENV = "SPARKEOS_STOMP_SPOOL_DIR"
FORMAT_NAME = "sparkeos-stomp"
BODY_FORMATS = ("binary", "string", "json")
ON_BAD_MESSAGE = ("fail", "dead-letter")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def default_spool_root() -> str:
    configured = os.environ.get(SPOOL_ENV)
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    return os.path.join(os.path.expanduser("~"), ".sparkeos", "stomp-spool")


@dataclass(frozen=True)
class StompSourceConfig:
    """Settings of :func:`stomp_source` (validated at construction).

    ``message_id_header`` / ``message_id_fn(headers) -> str``: where a message's stable
    ID comes from; default: the broker's own ``message-id`` where it is stable (Artemis:
    the part after the comma; ActiveMQ Classic: all of it). RabbitMQ changes
    ``message-id`` on every delivery: set one of the two. ``require_ids``: a message
    without a usable ID is an error (exactly-once); False lets it through undeduplicated.
    """

    url: str
    destination: str
    name: str | None = None
    spool_dir: str | None = None
    passcode: str | None = field(default=None, repr=False)
    message_id_header: str | None = None
    message_id_fn: Callable[[Mapping[str, str]], str | None] | None = None
    require_ids: bool = True
    body_format: str = "binary"
    on_bad_message: str = "fail"
    dead_letter_destination: str | None = None
    max_batch_messages: int = 10_000
    partition_messages: int = 50_000
    max_seen_ids: int = 1_000_000
    poll_timeout_s: float = 2.0
    idle_timeout_s: float = 0.2
    timeout_s: float = 30.0
    subscription_type: str | None = "ANYCAST"
    ssl_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    connect_headers: Mapping[str, str] = field(default_factory=dict)
    heartbeats: tuple[int, int] = (0, 0)
    fsync: bool = True

    def __post_init__(self) -> None:
        Endpoint.parse(self.url, passcode=self.passcode)
        if not self.destination:
            raise ConfigurationError("stomp_source needs a destination",
                                     fix="stomp_source(spark, url, 'orders')")
        if self.body_format not in BODY_FORMATS:
            raise ConfigurationError(f"unknown body_format {self.body_format!r}",
                                     fix=f"use one of {', '.join(BODY_FORMATS)}")
        if self.on_bad_message not in ON_BAD_MESSAGE:
            raise ConfigurationError(
                f"unknown on_bad_message {self.on_bad_message!r}",
                fix="use 'fail' (stop the query, the message stays on the broker) or "
                "'dead-letter' with dead_letter_destination=...",
            )
        if self.on_bad_message == "dead-letter" and not self.dead_letter_destination:
            raise ConfigurationError("on_bad_message='dead-letter' needs a destination",
                                     fix="stomp_source(..., dead_letter_destination='orders.dlq')")
        for name in ("max_batch_messages", "partition_messages", "max_seen_ids"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name}={value!r} must be a positive integer")
        if self.max_seen_ids < 2 * self.max_batch_messages:
            raise ConfigurationError(
                f"max_seen_ids={self.max_seen_ids} is below twice max_batch_messages="
                f"{self.max_batch_messages}: the IDs of one spooled and one redelivered "
                "batch would not fit", fix="raise max_seen_ids or lower max_batch_messages")
        for name in ("poll_timeout_s", "idle_timeout_s", "timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name}={getattr(self, name)!r} must be > 0")
        if self.name is not None and (not self.name or _UNSAFE.search(self.name)):
            raise ConfigurationError(f"invalid source name {self.name!r}",
                                     fix="use letters, digits, '.', '_' and '-'")
        object.__setattr__(self, "heartbeats", tuple(self.heartbeats))
        object.__setattr__(self, "ssl_options", dict(self.ssl_options))
        object.__setattr__(self, "connect_headers", dict(self.connect_headers))

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in fields(self)
                 if f.repr and f.name != "url"}
        return f"StompSourceConfig(url={redact_url(self.url)!r}, " + ", ".join(
            f"{k}={v!r}" for k, v in shown.items() if k != "url") + ")"

    @property
    def source_name(self) -> str:
        return self.name or _UNSAFE.sub("_", self.destination.strip("/"))

    @property
    def spool_path(self) -> str:
        if self.spool_dir:
            return os.path.abspath(os.path.expanduser(self.spool_dir))
        return os.path.join(default_spool_root(), self.source_name)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint.parse(self.url, passcode=self.passcode)

    def schema(self) -> str:
        body = "binary" if self.body_format == "binary" else "string"
        return ("message_id string, destination string, headers map<string,string>, "
                f"body {body}, timestamp timestamp")

    def encode(self) -> str:
        from pyspark import cloudpickle

        return base64.b64encode(cloudpickle.dumps(self)).decode()  # type: ignore[no-untyped-call]

    @staticmethod
    def decode(text: str) -> StompSourceConfig:
        from pyspark import cloudpickle

        config = cloudpickle.loads(base64.b64decode(text))
        assert isinstance(config, StompSourceConfig)
        return config

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> StompSourceConfig:
        """From ``spark.readStream.format("sparkeos-stomp").option(...)`` strings."""
        if "secret_config" in options:
            return cls.decode(options["secret_config"])
        known = {f.name: f for f in fields(cls)}
        settings: dict[str, Any] = {}
        for key, raw in options.items():
            if key == "path":
                continue
            if key not in known or key in ("message_id_fn", "ssl_options", "connect_headers"):
                raise ConfigurationError(f"unknown option {key!r} of {FORMAT_NAME}",
                                         fix=f"options: {', '.join(sorted(known))}")
            default = known[key].default
            if isinstance(default, bool):
                settings[key] = raw.lower() in ("1", "true", "yes")
            elif isinstance(default, int):
                settings[key] = int(raw)
            elif isinstance(default, float):
                settings[key] = float(raw)
            else:
                settings[key] = raw
        return cls(**settings)


def stomp_source(spark: Any, url: str, destination: str, **settings: Any) -> Any:
    """A streaming DataFrame of the messages of ``destination`` (see
    :class:`StompSourceConfig` for ``settings``). Columns: ``message_id``,
    ``destination``, ``headers`` (map), ``body`` (binary, or string for
    ``body_format="string"/"json"``), ``timestamp``.

    Pair it with an exactly-once sink: the source acknowledges a message only once the
    batch that holds it is committed, and drops redeliveries by the message's ID."""
    config = StompSourceConfig(url, destination, **settings)
    if config.spool_dir is None and not os.environ.get(SPOOL_ENV):
        from sparkeos.core.spark import runs_on_one_host

        if not runs_on_one_host(spark):
            raise ConfigurationError(
                f"stomp_source({destination!r}) would spool under {default_spool_root()} "
                "(this host's home directory), but the query runs on a cluster: the "
                "executors read the spool, and on other hosts it is not there",
                fix="give stomp_source(..., spool_dir=...) a directory the driver and "
                f"every executor reach at the same path (a shared mount), or set "
                f"${SPOOL_ENV}; nothing was read from the broker")
    spark.dataSource.register(StompDataSource)
    return (spark.readStream.format(FORMAT_NAME).option("secret_config", config.encode())
            .load())


# -- Spark's Python data source API --------------------------------------------------------
from pyspark.sql.datasource import (  # noqa: E402  (pyspark is a dependency)
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (  # noqa: E402
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)


class StompDataSource(DataSource):
    """``spark.readStream.format("sparkeos-stomp")``; use :func:`stomp_source`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def _config(self) -> StompSourceConfig:
        return StompSourceConfig.from_options(self.options)

    def schema(self) -> str:
        return self._config().schema()

    def streamReader(self, schema: Any) -> StompStreamReader:
        return StompStreamReader(self._config())


@dataclass
class SpoolPartition(InputPartition):  # type: ignore[misc]
    files: list[str]
    low: int
    high: int
    body_format: str

    def __init__(self, files: list[str], low: int, high: int, body_format: str) -> None:
        super().__init__(None)
        self.files, self.low, self.high, self.body_format = files, low, high, body_format


class StompStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    def __init__(self, config: StompSourceConfig) -> None:
        self.config = config
        self._runtime: Runtime | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "_runtime": None}

    # -- runner process ----------------------------------------------------------------------
    def initialOffset(self) -> dict[str, int]:
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.config.max_batch_messages)

    def prepareForTriggerAvailableNow(self) -> None:
        """A queue has no "latest offset" to stop at: an availableNow run ends at the
        first pull that finds nothing within ``poll_timeout_s``."""

    def latestOffset(self, start: dict[str, int] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, int]:
        committed = int((start or {}).get("seq", 0))
        most = self.config.max_batch_messages
        if isinstance(limit, ReadMaxRows):
            most = max(1, min(most, int(limit.max_rows)))
        elif limit is not None and not isinstance(limit, ReadAllAvailable):
            most = self.config.max_batch_messages
        runtime = self._get_runtime()
        runtime.settle(committed, at_start=True)
        return {"seq": runtime.pull(committed, most)}

    def commit(self, end: dict[str, int]) -> None:
        self._get_runtime().settle(int(end.get("seq", 0)), at_start=False)

    def stop(self) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime.close()

    def _get_runtime(self) -> Runtime:
        if self._runtime is None:
            self._runtime = Runtime(self.config)
        return self._runtime

    # -- planning and executors ----------------------------------------------------------------
    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        low, high = int(start.get("seq", 0)), int(end.get("seq", 0))
        if high <= low:
            return []
        chosen = [p for p in list_pulls(self.config.spool_path)
                  if p.last > low and p.first <= high]
        covered = sum(min(p.last, high) - max(p.first, low + 1) + 1 for p in chosen)
        if covered != high - low:
            raise ConfigurationError(
                f"the spool {self.config.spool_path} lacks messages {low + 1}..{high} that "
                f"Spark's offset log says were read (it holds {covered} of {high - low})",
                fix="the spool was deleted or belongs to another query; restore it, or "
                "start the query with a new checkpoint (messages not acknowledged are "
                "redelivered by the broker)",
            )
        parts: list[InputPartition] = []
        group: list[Pull] = []
        size = 0
        for pull in chosen:
            group.append(pull)
            size += pull.last - pull.first + 1
            if size >= self.config.partition_messages:
                parts.append(SpoolPartition([p.path for p in group], low, high,
                                            self.config.body_format))
                group, size = [], 0
        if group:
            parts.append(SpoolPartition([p.path for p in group], low, high,
                                        self.config.body_format))
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa

        assert isinstance(partition, SpoolPartition)
        missing = [f for f in partition.files if not os.path.exists(f)]
        if missing:
            import socket

            raise ConfigurationError(
                f"the STOMP source's spool file {missing[0]} is not on host "
                f"{socket.gethostname()}: the spool directory is not shared with this "
                "executor (or was deleted)",
                fix="set stomp_source(..., spool_dir=...) to a directory the driver and "
                "every executor reach at the same path; the messages stay "
                "unacknowledged on the broker, nothing is lost")
        for batch in read_pulls(partition.files, partition.low, partition.high):
            columns = [batch.column("message_id"), batch.column("destination"),
                       batch.column("headers"), batch.column("body"),
                       batch.column("timestamp")]
            if partition.body_format != "binary":
                columns[3] = columns[3].cast(pa.string())
            yield pa.RecordBatch.from_arrays(
                columns, names=["message_id", "destination", "headers", "body", "timestamp"])


__all__ = ["StompDataSource", "StompSourceConfig", "default_spool_root", "redact_url",
           "stomp_source"]
