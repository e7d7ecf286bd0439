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

This module holds Spark's data source API; the settings are ``sourceconfig``
(``StompSourceConfig``, re-exported here), the runner process's bookkeeping is
``runtime`` (with ``connection``, ``spool``, ``seen`` and ``messages``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sparkeos.core.errors import ConfigurationError

from .client import redact_url
from .runtime import Runtime
from .sourceconfig import FORMAT_NAME, SPOOL_ENV, StompSourceConfig, default_spool_root
from .spool import Pull, list_pulls, read_pulls


def stomp_source(spark: Any, url: str, destination: str, **settings: Any) -> Any:
    """A streaming DataFrame of the messages of ``destination`` (see
    :class:`StompSourceConfig` for ``settings``). Columns: ``message_id``,
    ``destination``, ``headers`` (map), ``body`` (binary, or string for
    ``body_format="string"/"json"``), ``timestamp``.

    Pair it with an exactly-once sink: the source acknowledges a message only once the
    batch that holds it is committed, and drops redeliveries by the message's ID."""
    config = StompSourceConfig(url, destination, **settings)
    if config.spool_dir is None and not os.environ.get(SPOOL_ENV):
        from sparkeos.core.streaming.spark import runs_on_one_host

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
