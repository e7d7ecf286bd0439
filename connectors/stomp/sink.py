"""Exactly-once STOMP sink (JMS-style brokers, stomp.py).

No STOMP broker keeps a transaction across connections, so a transaction cannot be
prepared in a task and committed later by the driver. The sink stages instead, as the
Kafka sink does (``commit_location = TASKS``):

Phase 1 (task attempt)
    Serialise the partition's messages (destination, body, headers) into an Arrow IPC
    file ``<staging_dir>/<attempt txn id>/records.arrow`` (a directory each attempt
    creates exclusively), fsync it. Nothing is sent. The receipt counts the messages
    per destination.

Before the decision (driver)
    With ``duplicate_detection="broker"``, a batch that sends more messages to one
    address than the broker's duplicate-ID cache holds (``id_cache_size``) is refused:
    after a crash, a re-publish could find the first messages' IDs already evicted.

Phase 2 (a Spark task per participant, after ``decided(N)``)
    Every staged message is sent with ``persistent:true`` and a deterministic ID from
    (query, sink, batch, partition, position): in ``_AMQ_DUPL_ID`` with
    ``duplicate_detection="broker"`` (ActiveMQ Artemis' duplicate detection; Artemis
    hands the header on to consumers), else in ``dedup_header`` (for consumers that
    deduplicate); a RECEIPT on the last send confirms them all. Then a PUBLISHED file
    ``<staging_dir>/published/<participant>.json`` records the batch (a retried commit
    returns at once) and the staged file is deleted.

    The sends are deliberately *not* one STOMP transaction: Artemis checks duplicate
    IDs of a transaction against committed ones only, so two concurrent attempts of
    one commit (speculation, a zombie task) would both commit theirs (measured). Plain
    sends are checked one by one, atomically: a re-publish, concurrent or after a
    crash part-way, adds exactly the messages that are missing. Consumers may so see
    the first messages of a participant before its last ones (all after the decision).

``duplicate_detection``
    ``"broker"`` (default): exactly-once on ActiveMQ Artemis; any other broker is
    refused before the first batch. ``"consumer"``: any broker; every consumer must
    drop duplicates by ``dedup_header`` (a sparkeos ``stomp_source`` with
    ``message_id_header`` set to it does): a re-publish after a crash reaches the
    queue twice. ``"none"``: at-least-once only (``at_least_once(sink, ...)``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from sparkeos.core.config import Guarantee
from sparkeos.core.errors import (
    ConfigurationError,
    DataLossError,
    RetriableError,
    SparkEOSError,
)
from sparkeos.core.fsutil import write_atomically
from sparkeos.core.protocol import (
    AttemptRange,
    CommitLocation,
    Receipt,
    Transaction,
    TransactionalSink,
    TxnState,
)
from sparkeos.core.records import RecordLayout, check_format, iter_records
from sparkeos.core.staging import StagingArea, default_dir
from sparkeos.core.steps import commit_step

from .client import (
    ARTEMIS,
    BrokerRejected,
    ConnectionLost,
    Endpoint,
    StompClient,
    redact_url,
)

STAGED_FILE = "records.arrow"
PUBLISHED_DIR = "published"
STAGING_ENV = "SPARKEOS_STOMP_STAGING_DIR"
DUPLICATE_DETECTION = ("broker", "consumer", "none")
ARTEMIS_DUPLICATE_HEADER = "_AMQ_DUPL_ID"
DEFAULT_DEDUP_HEADER = "sparkeos-dedup-id"
_RESERVED_HEADERS = frozenset({"destination", "transaction", "receipt", "content-length",
                               "persistent", ARTEMIS_DUPLICATE_HEADER.lower()})
_checked: dict[str, str] = {}
_checked_lock = threading.Lock()


def default_staging_dir() -> str:
    """``$SPARKEOS_STOMP_STAGING_DIR``, else ``~/.sparkeos/stomp-staging``."""
    return default_dir(STAGING_ENV, "stomp-staging")


@dataclass
class _Handle:
    txn: Transaction
    directory: str
    rows: int = 0
    file: Any = None
    writer: Any = None
    destinations: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StompSink(TransactionalSink[_Handle]):
    """Publish a foreachBatch DataFrame to a STOMP broker, exactly once on Artemis.

    ``url``: ``stomp://login:passcode@host:port`` (``stomp+ssl://`` for TLS; the
    passcode may be given as ``passcode=`` instead). ``destination`` (fixed) or
    ``destination_column`` (per row; ``destination`` is the default for nulls).
    ``body_column`` (default: the whole row as a JSON object) with ``body_format``
    (``bytes``/``string``/``json``, auto by type). ``headers_column``:
    ``map<string,string>`` or ``array<struct<key,value>>``; ``headers``: fixed headers
    added to every message (e.g. ``{"content-type": "application/json"}``).
    ``destination_type``: Artemis' routing type header (``ANYCAST`` = a queue;
    ``MULTICAST`` = a topic; None to send none, e.g. for RabbitMQ).

    ``duplicate_detection`` (see the module doc), ``id_cache_size``: the broker's
    ``id-cache-size`` for the destination's address (Artemis default 20000).
    ``staging_dir``: a directory every executor reaches at the same path. ``timeout_s``
    bounds every broker operation. ``ssl_options``: passed to stomp.py's ``set_ssl``;
    ``connect_headers``: extra CONNECT headers; ``heartbeats``: (send, receive) ms.
    """

    url: str
    destination: str | None = None
    destination_column: str | None = None
    body_column: str | None = None
    body_format: str | None = None
    headers_column: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    destination_type: str | None = "ANYCAST"
    duplicate_detection: str = "broker"
    id_cache_size: int = 20_000
    dedup_header: str = DEFAULT_DEDUP_HEADER
    passcode: str | None = field(default=None, repr=False)
    ssl_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    connect_headers: Mapping[str, str] = field(default_factory=dict)
    heartbeats: tuple[int, int] = (0, 0)
    staging_dir: str | None = None
    fsync: bool = True
    timeout_s: float = 30.0

    commit_location: ClassVar[CommitLocation] = CommitLocation.TASKS
    secret_fields: ClassVar[frozenset[str]] = frozenset({"passcode", "ssl_options"})
    commit_steps: ClassVar[tuple[str, ...]] = ("checked", "sent", "marked")

    def __post_init__(self) -> None:
        endpoint = Endpoint.parse(self.url, passcode=self.passcode)
        if self.destination is None and self.destination_column is None:
            raise ConfigurationError(
                "StompSink needs a destination or a destination_column",
                fix="StompSink(url, destination='orders') or "
                "StompSink(url, destination_column='queue')",
            )
        if self.duplicate_detection not in DUPLICATE_DETECTION:
            raise ConfigurationError(
                f"unknown duplicate_detection {self.duplicate_detection!r}",
                fix="use 'broker' (ActiveMQ Artemis), 'consumer' (every consumer drops "
                "duplicates by the dedup header) or 'none' (at-least-once)",
            )
        check_format("body_format", self.body_format)
        if self.body_column is None and self.body_format not in (None, "json"):
            raise ConfigurationError(
                f"body_format={self.body_format!r} needs a body_column; without one the "
                "body is the whole row as JSON",
                fix="set body_column='<column>' or drop body_format",
            )
        if not isinstance(self.id_cache_size, int) or self.id_cache_size < 1:
            raise ConfigurationError(f"id_cache_size={self.id_cache_size!r} must be >= 1",
                                     fix="give the broker's id-cache-size (default 20000)")
        if self.timeout_s <= 0:
            raise ConfigurationError(f"timeout_s={self.timeout_s!r} must be > 0")
        clash = sorted(k for k in self.headers if k.lower() in _RESERVED_HEADERS
                       or k == self.dedup_header)
        if clash:
            raise ConfigurationError(f"headers sets {', '.join(clash)}, which StompSink "
                                     "manages", fix="leave them out of headers=")
        object.__setattr__(self, "headers", {str(k): str(v) for k, v in self.headers.items()})
        object.__setattr__(self, "ssl_options", dict(self.ssl_options))
        object.__setattr__(self, "connect_headers", dict(self.connect_headers))
        object.__setattr__(self, "heartbeats", tuple(self.heartbeats))
        staging = self.staging_dir or default_staging_dir()
        if "://" in staging and not staging.startswith("file://"):
            # The PUBLISHED records beside the staged files are POSIX files.
            raise ConfigurationError(
                f"StompSink stages on POSIX paths; staging_dir {staging!r} is a URI",
                fix="give a local directory (local Spark) or a shared mount every "
                "executor reaches at the same path (a cluster)",
            )
        object.__setattr__(self, "staging_dir", os.path.abspath(os.path.expanduser(
            staging.removeprefix("file://"))))
        object.__setattr__(self, "_endpoint", endpoint)
        if self.duplicate_detection == "none":
            object.__setattr__(self, "guarantees",
                               frozenset({Guarantee.AT_LEAST_ONCE, Guarantee.NONE}))

    def __repr__(self) -> str:
        """Never the passcode, in the URL or not."""
        shown = ", ".join(f"{k}={v!r}" for k, v in self.describe().items())
        return f"StompSink({shown})"

    def __hash__(self) -> int:
        return hash(json.dumps(self.describe(), sort_keys=True, default=str))

    # -- identity / description -------------------------------------------------------------
    @property
    def endpoint(self) -> Endpoint:
        return object.__getattribute__(self, "_endpoint")  # type: ignore[no-any-return]

    def identity(self) -> dict[str, Any]:
        return {"broker": self.endpoint.address, "vhost": self.endpoint.vhost,
                "destination": self.destination,
                "destination_column": self.destination_column}

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["url"] = redact_url(self.url)
        if self.endpoint.passcode is not None:
            out["passcode_omitted"] = True
        return out

    @classmethod
    def from_description(cls, description: Mapping[str, Any]) -> StompSink:
        settings = dict(description)
        if settings.pop("passcode_omitted", False) and not settings.get("passcode"):
            raise ConfigurationError(
                "the recorded StompSink omits its passcode",
                fix="give it: `sparkeos recover <checkpoint> --set passcode=...`; or "
                "rebuild the sink in your code (with its passcode) and restart the query: "
                "it finishes any pending commits first",
            )
        settings["heartbeats"] = tuple(settings.get("heartbeats", (0, 0)))
        return cls(**settings)

    @property
    def id_header(self) -> str:
        """The header that carries each message's duplicate ID."""
        if self.duplicate_detection == "broker":
            return ARTEMIS_DUPLICATE_HEADER
        return self.dedup_header

    def shared_paths(self) -> tuple[str, ...]:
        return (self.staging.path,)

    @property
    def staging(self) -> StagingArea:
        assert self.staging_dir is not None
        return StagingArea(self.staging_dir,
                           setting=f"StompSink(staging_dir=...) / ${STAGING_ENV}")

    def layout(self) -> RecordLayout:
        return RecordLayout(self.destination, self.destination_column, None, self.body_column,
                            self.headers_column, None, self.body_format,
                            target="destination", owner="StompSink")

    def client(self) -> StompClient:
        return StompClient(self.endpoint, timeout_s=self.timeout_s, heartbeats=self.heartbeats,
                           ssl_options=self.ssl_options, connect_headers=self.connect_headers)

    # -- driver --------------------------------------------------------------------------------
    def validate(self, schema: pa.Schema) -> None:
        self.layout().check_schema(schema)
        self.__dict__["_mark"] = self.staging.check_on_driver(self.__dict__.get("_mark"))
        self.check_broker()

    def check_broker(self) -> str:
        """Log in once per process and configuration; refuse ``duplicate_detection=
        "broker"`` on a broker without duplicate detection. Returns the broker kind."""
        key = f"{self.endpoint.address}|{self.endpoint.login}|{self.duplicate_detection}"
        with _checked_lock:
            if key in _checked:
                return _checked[key]
        with self.client() as client:
            kind, server = client.kind, client.server
        if self.duplicate_detection == "broker" and kind != ARTEMIS:
            raise ConfigurationError(
                f"the STOMP broker at {self.endpoint.address} ({server or 'unknown server'}) "
                "has no duplicate detection, so a batch re-published after a crash would "
                "reach the queue twice",
                fix="use ActiveMQ Artemis; or StompSink(duplicate_detection='consumer') if "
                f"every consumer drops duplicates by the {self.dedup_header!r} header (a "
                "sparkeos stomp_source does); or duplicate_detection='none' with "
                "at_least_once(sink, ...); nothing was written",
            )
        with _checked_lock:
            _checked[key] = kind
        return kind

    def before_decision(self, batch_id: int, receipts: Any) -> None:
        if self.duplicate_detection != "broker":
            return
        per_address: dict[str, int] = {}
        for receipt in receipts:
            for address, count in (receipt.get("destinations") or {}).items():
                per_address[address] = per_address.get(address, 0) + int(count)
        over = {a: n for a, n in per_address.items() if n > self.id_cache_size}
        if over:
            address, count = max(over.items(), key=lambda item: item[1])
            raise ConfigurationError(
                f"batch {batch_id} would send {count} messages to {address!r}, more than "
                f"the broker's duplicate-ID cache holds (id_cache_size={self.id_cache_size})"
                ": after a crash, a re-publish could find the first IDs evicted and "
                "duplicate them",
                batch_id=batch_id,
                fix="raise id-cache-size in the broker's address-settings for this address "
                "and StompSink(id_cache_size=...) to match, then restart (the batch is "
                "written then); and bound the source's batch size (maxOffsetsPerTrigger, "
                "stomp_source(max_batch_messages=...)); nothing of this batch was sent",
            )

    # -- phase 1 ------------------------------------------------------------------------------
    def begin(self, txn: Transaction) -> _Handle:
        return _Handle(txn, self.staging.claim(txn, self.__dict__.get("_mark")))

    def write(self, handle: _Handle, batch: pa.RecordBatch) -> None:
        records = self.layout().serialize(batch)
        handle.rows += records.num_rows
        if "topic" in records.schema.names:
            counts = pc.value_counts(records.column("topic"))
            for item in counts.to_pylist():
                name = item["values"]
                handle.destinations[name] = handle.destinations.get(name, 0) + item["counts"]
        elif records.num_rows:
            name = str(self.destination)
            handle.destinations[name] = handle.destinations.get(name, 0) + records.num_rows
        if handle.writer is None:
            handle.file = pa.OSFile(self.staging.writable_file(handle.directory, STAGED_FILE),
                                    "wb")
            handle.writer = pa.ipc.new_file(handle.file, records.schema)
        handle.writer.write_batch(records)

    def prepare(self, handle: _Handle) -> Receipt:
        if handle.writer is None or handle.rows == 0:
            self.abort(handle, handle.txn)
            return {"file": None, "rows": 0}
        handle.writer.close()
        handle.file.close()
        relative = self.staging.seal(handle.directory, STAGED_FILE,
                                     os.path.join(handle.directory, STAGED_FILE), self.fsync)
        return {"file": relative, "rows": handle.rows,
                "destinations": handle.destinations, "host": socket.gethostname()}

    def abort(self, handle: _Handle, txn: Transaction) -> None:
        for closable in (handle.writer, handle.file):
            if closable is not None:
                with contextlib.suppress(Exception):
                    closable.close()
        self.staging.discard(handle.directory, None)

    # -- phase 2 / recovery ---------------------------------------------------------------------
    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        if not receipt.get("file") or not receipt.get("rows"):
            self.rollback(txn)
            return
        if self._published_batch(txn) >= txn.batch_id:
            self.rollback(txn)  # published before (a retried commit): idempotent
            return
        commit_step("checked", txn)
        try:
            self._publish(txn, self._staged_path(txn, receipt))
        except (DataLossError, FileNotFoundError) as exc:
            # A concurrent attempt of this commit may have published and deleted the
            # staged file between our checks: its PUBLISHED record says so.
            if self._published_batch(txn) >= txn.batch_id:
                return
            if isinstance(exc, DataLossError):
                raise
            raise self._lost(txn, "the staged file vanished while it was read") from None
        except SparkEOSError:
            raise
        except BrokerRejected as exc:
            raise ConfigurationError(
                f"the broker refused the publish of participant {txn.participant_id}: "
                f"{exc} {exc.body}".strip()[:500],
                sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
                fix="check the destination and the user's send permission on the broker; "
                "the batch is decided, so a restart publishes it then",
            ) from None
        except (ConnectionLost, TimeoutError, OSError) as exc:
            raise RetriableError(
                f"publishing participant {txn.participant_id} to {self.endpoint.address} "
                f"failed: {exc}",
                sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
                fix="the batch is decided: it is published when the broker is back (Spark "
                "retries the task; else restart the query); the broker drops what a "
                "re-publish repeats",
            ) from None
        commit_step("sent", txn)
        self._mark_published(txn)
        commit_step("marked", txn)
        self.rollback(txn)

    def _publish(self, txn: Transaction, path: str) -> None:
        stem = f"seos-{txn.query_key}-{txn.sink}-b{txn.batch_id}-p{txn.partition}-"
        id_header = self.id_header
        fixed = dict(self.headers)
        fixed["persistent"] = "true"
        if self.destination_type:
            fixed["destination-type"] = self.destination_type
        def frames() -> Iterator[tuple[str, bytes, dict[str, str]]]:
            for position, (destination, body, headers) in enumerate(
                    self._staged_messages(path)):
                yield destination, body or b"", {**(headers or {}), **fixed,
                                                 id_header: f"{stem}{position}"}

        with self.client() as client:
            client.send_all(frames(), f"participant {txn.participant_id}")

    def _staged_messages(self, path: str) -> Iterator[tuple[str, bytes | None,
                                                             dict[str, str] | None]]:
        default = self.destination
        with pa.memory_map(path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                for topic, value, _key, headers in iter_records(reader.get_batch(i)):
                    yield (topic or default or "", value,
                           None if headers is None else {
                               k: (v.decode("utf-8", "replace") if isinstance(v, bytes)
                                   else str(v)) for k, v in headers if v is not None})

    def rollback(self, txn: Transaction) -> None:
        """Delete what the attempt staged (nothing of it was ever sent)."""
        self.staging.delete(txn)

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        self.staging.sweep(ranges, keep)

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        """PUBLISHED records of this sink name under other query keys (a lost
        checkpoint), from the staging directory's ``published/``."""
        try:
            names = os.listdir(os.path.join(self._root(), PUBLISHED_DIR))
        except FileNotFoundError:
            return None
        pattern = re.compile(r"^seos-([^-]+)-" + re.escape(sink) + r"-p\d+-s\d+\.json$")
        others = sorted({m.group(1) for m in map(pattern.match, names)
                         if m and m.group(1) != query_key})
        if not others:
            return None
        return (f"PUBLISHED records in {os.path.join(self._root(), PUBLISHED_DIR)} of "
                f"query keys {', '.join(others)}")

    def probe(self, txn: Transaction) -> TxnState:
        if os.path.exists(os.path.join(self.staging.txn_dir(txn), STAGED_FILE)):
            return TxnState.PREPARED
        if self._published_batch(txn) >= txn.batch_id:
            return TxnState.COMMITTED
        if os.path.isdir(self.staging.txn_dir(txn)):
            return TxnState.OPEN
        return TxnState.ABSENT

    # -- files -----------------------------------------------------------------------------------
    def _root(self) -> str:
        return self.staging.root

    def _published_file(self, txn: Transaction) -> str:
        return os.path.join(self._root(), PUBLISHED_DIR, f"{txn.participant_id}.json")

    def _published_batch(self, txn: Transaction) -> int:
        """The last batch published for the participant (-1 if none). One file per
        pooled participant ID: its slot is reused two batches later, once this batch
        is finished and never committed again."""
        try:
            with open(self._published_file(txn), "rb") as fh:
                return int(json.loads(fh.read())["batch"])
        except (FileNotFoundError, ValueError, KeyError):
            return -1

    def _mark_published(self, txn: Transaction) -> None:
        final = self._published_file(txn)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        write_atomically(final, json.dumps({"batch": txn.batch_id, "txn": txn.txn_id}).encode(),
                         fsync=self.fsync)

    def _staged_path(self, txn: Transaction, receipt: Receipt) -> str:
        path = self.staging.staged_file(txn, receipt, txn.txn_id)
        if path is None:
            raise self._lost(txn, f"the staged file {receipt['file']} of a decided "
                             "transaction is gone")
        return path

    def _lost(self, txn: Transaction, problem: str) -> DataLossError:
        return DataLossError(
            f"{problem} and no PUBLISHED record says it was sent",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="something deleted the staging directory: restore it from a backup, or "
            "re-process this batch from the source",
        )


__all__ = ["StompSink", "default_staging_dir"]
