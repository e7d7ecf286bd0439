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
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from sparkeos.core.errors import BadMessageError, ConfigurationError
from sparkeos.core.faults import SourceFaults

from .client import (
    ARTEMIS,
    CLASSIC,
    RABBITMQ,
    ConnectionLost,
    Endpoint,
    StompClient,
    redact_url,
)
from .spool import Pull, Spool, list_pulls, read_pulls

log = logging.getLogger("sparkeos.stomp.source")

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
        self._runtime: _Runtime | None = None

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

    def _get_runtime(self) -> _Runtime:
        if self._runtime is None:
            self._runtime = _Runtime(self.config)
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


class _Runtime:
    """The reader's live state in the runner process: spool, seen IDs, connection."""

    def __init__(self, config: StompSourceConfig) -> None:
        self.config = config
        self.spool = Spool(config.spool_path, max_ids=config.max_seen_ids,
                           fsync=config.fsync)
        self.client: StompClient | None = None
        self.kind: str | None = None
        self.acks: dict[str, str] = {}
        """Message ID -> ack handle, for messages delivered on the live connection."""
        self.live_pulls: set[str] = set()
        """Pulls spooled by this process (their messages are unacked on this connection)."""
        self.dropped_total = 0
        self.acked_total = 0
        self.faults = SourceFaults()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        self.spool.close()

    # -- acknowledgement -----------------------------------------------------------------------
    def settle(self, committed: int, *, at_start: bool) -> None:
        """Everything up to ``committed`` is processed: acknowledge what this connection
        can, forget the IDs whose ack is confirmed, delete their spool. At ``start``
        also drop pulls beyond it that no offset recorded."""
        spool = self.spool
        if committed < spool.committed:
            raise ConfigurationError(
                f"Spark restarted the STOMP source {self.config.source_name!r} at offset "
                f"{committed}, but its spool {spool.directory} already acknowledged "
                f"messages up to {spool.committed}: the checkpoint was lost or replaced",
                fix="a new checkpoint needs a new spool: stomp_source(name=...) or "
                "spool_dir=... (or delete the old spool; the broker redelivers whatever "
                "it did not see acknowledged)",
            )
        pulls = spool.pulls()
        if at_start:
            stale = [p for p in pulls if p.last > committed and p.path not in self.live_pulls]
            if stale:
                for pull in stale:
                    spool.delete(pull)
                spool.seen.forget_after(committed)
                spool.save_seen()
                log.info("dropped %d spooled messages no offset recorded (seq > %d); the "
                         "broker redelivers them", sum(p.last - p.first + 1 for p in stale),
                         committed)
        done = spool.seen.ids_through(committed)
        handles = [(mid, self.acks[mid]) for mid in done if mid in self.acks]
        if handles:
            self.faults.reached("source_before_ack")
            confirmed = self._ack([h for _, h in handles])
            for mid, _ in handles:
                self.acks.pop(mid, None)
            if confirmed:
                self.faults.reached("source_after_ack")
                self._forget([mid for mid, _ in handles], committed)
                self.acked_total += len(handles)
        for pull in pulls:
            if pull.last <= committed:
                spool.delete(pull)
                self.live_pulls.discard(pull.path)
        spool.save_committed(committed)

    def _forget(self, acknowledged: list[str], committed: int) -> None:
        """IDs whose ack is confirmed. The broker's own message IDs name one message,
        which cannot come again once acknowledged: forget them. IDs from a producer's
        header may name several copies (a producer that re-sent): keep them as long as
        the bound allows, oldest committed batches dropped first."""
        seen = self.spool.seen
        if self.config.message_id_header is None and self.config.message_id_fn is None:
            seen.discard(acknowledged)
        else:
            room = seen.max_ids - 2 * self.config.max_batch_messages
            while len(seen) > room:
                oldest = seen.oldest_batch()
                if oldest is None or oldest > committed:
                    break
                seen.acknowledged(oldest)
        self.spool.save_seen()

    def _ack(self, handles: Sequence[str]) -> bool:
        """ACK each handle; the RECEIPT of the last confirms them all (a connection
        processes frames in order). False if the connection dropped first (a broker
        restart): its handles are void, the broker sends the messages again, and
        their IDs, still recorded, tell them apart (acknowledged then)."""
        client = self.client
        if client is None or not client.connected:
            self._drop_connection()
            return False
        receipt = client.new_receipt()
        try:
            for i, handle in enumerate(handles):
                client.ack(handle, receipt=receipt if i == len(handles) - 1 else None)
            client.wait_receipt(receipt, f"the acknowledgement of {len(handles)} messages")
        except ConnectionLost as exc:
            log.warning("stomp source %s: %s; the unconfirmed messages come again and are "
                        "recognised by their IDs", self.config.source_name, exc)
            self._drop_connection()
            return False
        return True

    def _drop_connection(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        self.acks.clear()
        self.live_pulls.clear()

    # -- pulling ----------------------------------------------------------------------------------
    def _connected(self) -> StompClient:
        if self.client is not None and self.client.connected:
            return self.client
        # A new connection: the old one's ack handles are void and its unacked messages
        # come again (recognised by ID).
        self._drop_connection()
        config = self.config
        client = StompClient(config.endpoint, timeout_s=config.timeout_s,
                             heartbeats=config.heartbeats, ssl_options=config.ssl_options,
                             connect_headers=config.connect_headers).connect()
        self.kind = client.kind
        headers: dict[str, str] = {}
        if config.subscription_type and self.kind == ARTEMIS:
            headers["subscription-type"] = config.subscription_type
            headers["consumer-window-size"] = "-1"
        elif self.kind == CLASSIC:
            headers["activemq.prefetchSize"] = str(2 * config.max_batch_messages)
        elif self.kind == RABBITMQ:
            headers["prefetch-count"] = str(2 * config.max_batch_messages)
        try:
            client.subscribe(config.destination, "sparkeos-source", "client-individual",
                             headers)
        except BaseException:
            client.close()
            raise
        self.client = client
        return client

    def pull(self, committed: int, most: int) -> int:
        """Receive up to ``most`` new messages, spool them after ``committed`` (or after
        the pulls this connection spooled and no batch took yet); the new offset."""
        client = self._connected()
        live = [p for p in self.spool.pulls() if p.path in self.live_pulls
                and p.last > committed]
        if live:
            return max(p.last for p in live)
        seq = committed
        rows: list[dict[str, Any]] = []
        redelivered: list[tuple[str, str]] = []
        copies: list[str] = []
        pulled: set[str] = set()
        wait = self.config.poll_timeout_s
        deadline = time.monotonic() + self.config.timeout_s
        lost = False
        while len(rows) < most and time.monotonic() < deadline:
            try:
                frame = client.receive(wait)
            except ConnectionLost:
                lost = True  # what arrived is spooled; the broker sends it again
                break
            if frame is None:
                break
            wait = self.config.idle_timeout_s
            headers = {str(k): str(v) for k, v in frame.headers.items()}
            handle = headers.get("ack") or headers.get("message-id", "")
            message_id = self._message_id(headers)
            if message_id is not None and (message_id in self.spool.seen
                                           or message_id in pulled):
                batch = self.spool.seen.batch_of(message_id)
                if batch is not None and batch <= committed:
                    redelivered.append((message_id, handle))  # processed: ack it now
                elif message_id in self.acks:
                    # Another copy (a producer re-sent it) of a message this connection
                    # holds unacked in the spool: that one stands for both.
                    copies.append(handle)
                else:
                    self.acks[message_id] = handle  # spooled before, redelivered now
                self.dropped_total += 1
                continue
            if not rows:
                self._forget_orphans(committed, {mid for mid, _ in redelivered})
            body = frame.body if isinstance(frame.body, bytes) else str(frame.body).encode()
            problem = self._check_body(body)
            if problem is not None:
                self._bad_message(client, message_id, headers, body, handle, problem)
                continue
            seq += 1
            rows.append({"seq": seq, "message_id": message_id,
                         "destination": headers.get("destination", self.config.destination),
                         "headers": headers, "body": body,
                         "timestamp": _timestamp(headers)})
            if message_id is not None:
                self.acks[message_id] = handle
                pulled.add(message_id)
        if rows:
            pull = self.spool.write_pull(rows)
            self.spool.seen.add(pull.last, [r["message_id"] for r in rows
                                            if r["message_id"] is not None])
            self.spool.save_seen()
            self.live_pulls.add(pull.path)
        if lost:
            self._drop_connection()
        if (redelivered or copies) and self._ack([h for _, h in redelivered] + copies):
            self._forget([mid for mid, _ in redelivered], committed)
            self.acked_total += len(redelivered) + len(copies)
        if rows:
            self.faults.reached("source_after_spool")
            self.faults.reached("source_pause_after_spool")
        log.info("stomp source %s: spooled %d (seq %d..%d), redeliveries dropped %d, "
                 "seen IDs %d, acknowledged so far %d", self.config.source_name, len(rows),
                 committed + 1, seq, len(redelivered), len(self.spool.seen), self.acked_total)
        return seq

    def _forget_orphans(self, committed: int, redelivered_now: set[str]) -> None:
        """A new message arrived: every processed message the broker still held
        unacknowledged was redelivered before it (brokers redeliver unacknowledged
        messages ahead of new ones, at the head of the queue). So a processed ID with no
        ack handle on this connection, not redelivered by now, was acknowledged: its ACK
        reached the broker on an earlier connection but the RECEIPT did not come back
        (the connection dropped, or this process restarted). Forget it; kept, such IDs
        would fill the store until the source halts. Broker message IDs only: a
        producer's header ID may come again as a copy, and stays for the bound."""
        if self.config.message_id_header is not None or self.config.message_id_fn is not None:
            return
        orphans = [mid for mid in self.spool.seen.ids_through(committed)
                   if mid not in self.acks and mid not in redelivered_now]
        if orphans:
            self.spool.seen.discard(orphans)
            self.spool.save_seen()
            log.info("stomp source %s: forgot %d IDs whose acknowledgement was sent but "
                     "not confirmed (not redelivered before new messages)",
                     self.config.source_name, len(orphans))

    def _message_id(self, headers: Mapping[str, str]) -> str | None:
        config = self.config
        if config.message_id_fn is not None:
            value = config.message_id_fn(headers)
        elif config.message_id_header:
            value = headers.get(config.message_id_header)
        elif self.kind == ARTEMIS:
            raw = headers.get("message-id", "")
            value = raw.split(",", 1)[1] if "," in raw else raw
        elif self.kind == CLASSIC:
            value = headers.get("message-id")
        else:
            value = None
        if value:
            return str(value)
        if not config.require_ids:
            return None
        where = (f"header {config.message_id_header!r}" if config.message_id_header
                 else "message_id_fn" if config.message_id_fn
                 else f"the broker's message-id ({self.kind} changes it on redelivery)")
        raise BadMessageError(
            f"a message on {config.destination!r} has no stable ID in {where} "
            f"(message-id {headers.get('message-id')!r}); without one a redelivery cannot "
            "be told from a new message",
            fix="set stomp_source(message_id_header='<a header your producers set>') (a "
            "sparkeos StompSink sets 'sparkeos-dedup-id') or message_id_fn=...; or "
            "require_ids=False for at-least-once; the message was not acknowledged",
        )

    def _check_body(self, body: bytes) -> str | None:
        if self.config.body_format == "binary":
            return None
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"the body is not UTF-8 ({exc.reason} at byte {exc.start})"
        if self.config.body_format == "json":
            try:
                json.loads(text)
            except ValueError as exc:
                return f"the body is not JSON ({exc})"
        return None

    def _bad_message(self, client: StompClient, message_id: str | None,
                     headers: Mapping[str, str], body: bytes, handle: str,
                     problem: str) -> None:
        config = self.config
        if config.on_bad_message == "fail":
            raise BadMessageError(
                f"message {message_id!r} on {config.destination!r} cannot be read as "
                f"body_format={config.body_format!r}: {problem}",
                fix="stomp_source(on_bad_message='dead-letter', dead_letter_destination="
                "'<queue>') to move such messages aside, or body_format='binary'; the "
                "message was not acknowledged, the broker keeps it",
            )
        assert config.dead_letter_destination is not None
        forwarded = {k: v for k, v in headers.items()
                     if k not in ("ack", "subscription", "message-id", "destination",
                                  "content-length", "redelivered", "receipt")}
        forwarded.update({"persistent": "true", "sparkeos-error": problem[:200],
                          "sparkeos-original-destination": config.destination})
        if message_id is not None:
            forwarded["sparkeos-message-id"] = message_id
            forwarded["_AMQ_DUPL_ID"] = f"seos-dlq-{message_id}"
        receipt = client.new_receipt()
        client.send(config.dead_letter_destination, body, forwarded, receipt=receipt)
        client.wait_receipt(receipt, "the dead-letter send")
        self._ack([handle])
        log.warning("stomp source %s: message %r moved to %s: %s", config.source_name,
                    message_id, config.dead_letter_destination, problem)


def _timestamp(headers: Mapping[str, str]) -> datetime.datetime:
    raw = headers.get("timestamp")
    if raw is not None:
        with contextlib.suppress(ValueError, OverflowError, OSError):
            return datetime.datetime.fromtimestamp(int(raw) / 1000, tz=datetime.timezone.utc)
    return datetime.datetime.now(tz=datetime.timezone.utc)


__all__ = ["StompDataSource", "StompSourceConfig", "default_spool_root", "redact_url",
           "stomp_source"]
