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

``StompSink`` is the protocol; each mechanism has a module of its own: ``config`` (the
settings checks), ``preflight`` (the broker and duplicate-ID cache checks), ``staging``
(phase 1's staged file), ``publish`` (phase 2's sends), ``published`` (the PUBLISHED
records), ``errors`` (what a failed publish becomes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from sparkeos.core.protocol import (
    AttemptRange,
    CommitLocation,
    Receipt,
    Transaction,
    TransactionalSink,
    TxnState,
)
from sparkeos.core.snapshot.fingerprint import Written
from sparkeos.core.steps import commit_step
from sparkeos.core.storage.staging import StagingArea
from sparkeos.core.text.records import RecordLayout

from . import config, errors, preflight, publish, published
from .client import Endpoint, StompClient, redact_url
from .config import ARTEMIS_DUPLICATE_HEADER, DEFAULT_DEDUP_HEADER, DUPLICATE_DETECTION
from .published import PUBLISHED_DIR
from .staging import (
    STAGED_FILE,
    STAGING_ENV,
    StagedAttempt,
    default_staging_dir,
    has_staged,
    ids_by_content,
    staged_path,
    staging_area,
)


@dataclass(frozen=True)
class StompSink(TransactionalSink[StagedAttempt]):
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
        for name, value in config.checked_settings(self).items():
            object.__setattr__(self, name, value)

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
        return cls(**config.settings_from_description(description))

    @property
    def id_header(self) -> str:
        """The header that carries each message's duplicate ID."""
        return config.id_header(self.duplicate_detection, self.dedup_header)

    def shared_paths(self) -> tuple[str, ...]:
        return (self.staging.path,) if self.staging.needs_sharing else ()

    @property
    def staging(self) -> StagingArea:
        # Made once, where it is first asked (the driver's validate): an object store's
        # endpoint is resolved there and travels to the tasks with the sink.
        area = self.__dict__.get("_staging")
        if area is None:
            assert self.staging_dir is not None
            area = self.__dict__["_staging"] = staging_area(self.staging_dir)
        return area

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
        return preflight.check_broker(self.endpoint, self.client, self.duplicate_detection,
                                      self.dedup_header)

    def before_decision(self, batch_id: int, receipts: Any) -> None:
        if self.duplicate_detection == "broker":
            preflight.check_id_cache(batch_id, receipts, self.id_cache_size)

    # -- phase 1 ------------------------------------------------------------------------------
    def begin(self, txn: Transaction) -> StagedAttempt:
        return StagedAttempt(txn, self.staging.claim(txn, self.__dict__.get("_mark")))

    def write(self, handle: StagedAttempt, batch: pa.RecordBatch) -> None:
        handle.append(self.layout().serialize(batch), self.staging, self.destination)

    def prepare(self, handle: StagedAttempt) -> Receipt:
        if handle.empty:
            self.abort(handle, handle.txn)
            return {"file": None, "rows": 0}
        return handle.seal(self.staging, self.fsync)

    def abort(self, handle: StagedAttempt, txn: Transaction) -> None:
        handle.discard(self.staging)

    # -- phase 2 / recovery ---------------------------------------------------------------------
    def commit(self, txn: Transaction, receipt: Receipt) -> None:
        written = Written.from_json(receipt.get("written"))
        if (not receipt.get("file") or not receipt.get("rows")
                or self._published(txn, written)):
            self.rollback(txn)  # nothing staged, or published before (a retried commit)
            return
        commit_step("checked", txn)
        if not errors.publish_translated(txn, self.endpoint.address,
                                         lambda: self._publish(txn, receipt, written),
                                         lambda: self._published(txn, written)):
            return  # a concurrent attempt of this commit published it
        commit_step("sent", txn)
        published.mark_published(self.staging, txn, self.fsync, written)
        commit_step("marked", txn)
        self.rollback(txn)

    def _publish(self, txn: Transaction, receipt: Receipt, written: Written | None) -> None:
        path = staged_path(self.staging, txn, receipt)
        messages = publish.frames(self.staging, path, self.destination,
                                  publish.fixed_headers(self.headers, self.destination_type),
                                  self.id_header, publish.message_id_stem(txn, written),
                                  ids_by_content(receipt))
        publish.publish(self.client, txn, messages)

    def _published(self, txn: Transaction, written: Written | None) -> bool:
        """Published before with these rows (a retried commit, a twin, a replay of the
        same partition); a record of other rows for this (batch, partition), left by an
        at-least-once run, does not count (``core.snapshot.replay``)."""
        return published.is_published(self.staging, txn, written)

    def rollback(self, txn: Transaction) -> None:
        """Delete what the attempt staged (nothing of it was ever sent)."""
        self.staging.delete(txn)

    def sweep(self, ranges: Sequence[AttemptRange], keep: frozenset[str]) -> None:
        self.staging.sweep(ranges, keep)

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        """PUBLISHED records of this sink name under other query keys (a lost
        checkpoint), from the staging directory's ``published/``."""
        return published.other_queries(self.staging, query_key, sink)

    def probe(self, txn: Transaction) -> TxnState:
        if has_staged(self.staging, txn):
            return TxnState.PREPARED
        if published.published_batch(self.staging, txn) >= txn.batch_id:
            return TxnState.COMMITTED
        if self.staging.is_claimed(txn):
            return TxnState.OPEN
        return TxnState.ABSENT


__all__ = ["ARTEMIS_DUPLICATE_HEADER", "DEFAULT_DEDUP_HEADER", "DUPLICATE_DETECTION",
           "PUBLISHED_DIR", "STAGED_FILE", "STAGING_ENV", "StompSink", "default_staging_dir"]
