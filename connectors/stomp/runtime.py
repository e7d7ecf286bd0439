"""The acknowledging source's runtime in Spark's source runner process: the two
things ``latestOffset``/``commit`` ask of it, in order.

``settle(committed)``
    everything up to ``committed`` is processed: acknowledge what the live connection
    can, forget the IDs whose ack is confirmed, delete their spool (at the start of a
    run also the pulls no offset recorded).
``pull(committed, most)``
    receive up to ``most`` messages, drop the redeliveries by stable ID, spool the new
    ones durably after ``committed`` and record their IDs; the new offset.

The mechanisms live beside it: ``connection`` (the broker connection and its ack
handles), ``spool`` (the durable pulls and the seen-ID store), ``seen`` (when IDs are
forgotten), ``messages`` (stable IDs, body checks, dead letters, spooled rows).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.faults import SourceFaults

from . import messages, seen
from .client import ConnectionLost, StompClient
from .connection import Connection
from .sourceconfig import StompSourceConfig
from .spool import Pull, Spool

log = logging.getLogger("sparkeos.stomp.source")


@dataclass
class _Received:
    """What one pull received."""

    committed: int
    seq: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    redelivered: list[tuple[str, str]] = field(default_factory=list)
    """(message ID, ack handle) of messages of committed batches: acknowledged now."""
    copies: list[str] = field(default_factory=list)
    """Ack handles of further copies of messages held unacked in the spool."""
    pulled: set[str] = field(default_factory=set)
    lost: bool = False
    """The connection dropped during the pull."""


class Runtime:
    """The reader's live state in the runner process: spool, seen IDs, connection."""

    def __init__(self, config: StompSourceConfig) -> None:
        self.config = config
        self.spool = Spool(config.spool_path, max_ids=config.max_seen_ids,
                           fsync=config.fsync)
        self.connection = Connection(config)
        self.dropped_total = 0
        self.acked_total = 0
        self.faults = SourceFaults()

    @property
    def client(self) -> StompClient | None:
        return self.connection.client

    def close(self) -> None:
        self.connection.close()
        self.spool.close()

    # -- acknowledgement -----------------------------------------------------------------------
    def settle(self, committed: int, *, at_start: bool) -> None:
        """Everything up to ``committed`` is processed: acknowledge what this connection
        can, forget the IDs whose ack is confirmed, delete their spool. At ``start``
        also drop pulls beyond it that no offset recorded."""
        self._check_not_behind(committed)
        pulls = self.spool.pulls()
        if at_start:
            self._drop_unrecorded(pulls, committed)
        self._acknowledge_through(committed)
        for pull in pulls:
            if pull.last <= committed:
                self.spool.delete(pull)
                self.connection.live_pulls.discard(pull.path)
        self.spool.save_committed(committed)

    def _check_not_behind(self, committed: int) -> None:
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

    def _drop_unrecorded(self, pulls: list[Pull], committed: int) -> None:
        """Pulls beyond ``committed`` that this process did not spool: no offset
        recorded them (the driver died in between), and their messages come again."""
        stale = [p for p in pulls
                 if p.last > committed and p.path not in self.connection.live_pulls]
        if not stale:
            return
        for pull in stale:
            self.spool.delete(pull)
        self.spool.seen.forget_after(committed)
        self.spool.save_seen()
        log.info("dropped %d spooled messages no offset recorded (seq > %d); the "
                 "broker redelivers them", sum(p.last - p.first + 1 for p in stale),
                 committed)

    def _acknowledge_through(self, committed: int) -> None:
        acks = self.connection.acks
        handles = [(mid, acks[mid]) for mid in self.spool.seen.ids_through(committed)
                   if mid in acks]
        if not handles:
            return
        self.faults.reached("source_before_ack")
        confirmed = self.connection.ack([h for _, h in handles])
        for mid, _ in handles:
            acks.pop(mid, None)
        if confirmed:
            self.faults.reached("source_after_ack")
            seen.forget_acknowledged(self.spool, self.config, [mid for mid, _ in handles],
                                     committed)
            self.acked_total += len(handles)

    # -- pulling ----------------------------------------------------------------------------------
    def pull(self, committed: int, most: int) -> int:
        """Receive up to ``most`` new messages, spool them after ``committed`` (or after
        the pulls this connection spooled and no batch took yet); the new offset."""
        client = self.connection.open()
        live = [p.last for p in self.spool.pulls()
                if p.path in self.connection.live_pulls and p.last > committed]
        if live:
            return max(live)
        received = _Received(committed, committed)
        self._receive(client, received, most)
        self._record(received)
        return received.seq

    def _receive(self, client: StompClient, received: _Received, most: int) -> None:
        wait = self.config.poll_timeout_s
        deadline = time.monotonic() + self.config.timeout_s
        while len(received.rows) < most and time.monotonic() < deadline:
            try:
                frame = client.receive(wait)
            except ConnectionLost:
                received.lost = True  # what arrived is spooled; the broker sends it again
                return
            if frame is None:
                return
            wait = self.config.idle_timeout_s
            self._take(client, received, frame)

    def _take(self, client: StompClient, received: _Received, frame: Any) -> None:
        headers = {str(k): str(v) for k, v in frame.headers.items()}
        handle = headers.get("ack") or headers.get("message-id", "")
        message_id = messages.stable_id(self.config, self.connection.kind, headers)
        if message_id is not None and (message_id in self.spool.seen
                                       or message_id in received.pulled):
            self._seen_again(received, message_id, handle)
            return
        if not received.rows:
            seen.forget_orphans(self.spool, self.config, received.committed,
                                self.connection.acks,
                                {mid for mid, _ in received.redelivered})
        body = frame.body if isinstance(frame.body, bytes) else str(frame.body).encode()
        problem = messages.body_problem(self.config.body_format, body)
        if problem is not None:
            messages.dead_letter(self.config, client, message_id, headers, body, problem)
            self.connection.ack([handle])
            messages.moved_aside(self.config, message_id, problem)
            return
        received.seq += 1
        received.rows.append(messages.row(received.seq, message_id, headers, body,
                                          self.config.destination))
        if message_id is not None:
            self.connection.acks[message_id] = handle
            received.pulled.add(message_id)

    def _seen_again(self, received: _Received, message_id: str, handle: str) -> None:
        """A message whose ID the store (or this pull) holds: a redelivery or a copy."""
        batch = self.spool.seen.batch_of(message_id)
        if batch is not None and batch <= received.committed:
            received.redelivered.append((message_id, handle))  # processed: ack it now
        elif message_id in self.connection.acks:
            # Another copy (a producer re-sent it) of a message this connection
            # holds unacked in the spool: that one stands for both.
            received.copies.append(handle)
        else:
            self.connection.acks[message_id] = handle  # spooled before, redelivered now
        self.dropped_total += 1

    def _record(self, received: _Received) -> None:
        """Spool what one pull received, then acknowledge its redeliveries."""
        rows = received.rows
        if rows:
            pull = self.spool.write_pull(rows)
            self.spool.seen.add(pull.last, [r["message_id"] for r in rows
                                            if r["message_id"] is not None])
            self.spool.save_seen()
            self.connection.live_pulls.add(pull.path)
        if received.lost:
            self.connection.drop()
        redelivered = received.redelivered
        if (redelivered or received.copies) and self.connection.ack(
                [h for _, h in redelivered] + received.copies):
            seen.forget_acknowledged(self.spool, self.config,
                                     [mid for mid, _ in redelivered], received.committed)
            self.acked_total += len(redelivered) + len(received.copies)
        if rows:
            self.faults.reached("source_after_spool")
            self.faults.reached("source_pause_after_spool")
        log.info("stomp source %s: spooled %d (seq %d..%d), redeliveries dropped %d, "
                 "seen IDs %d, acknowledged so far %d", self.config.source_name, len(rows),
                 received.committed + 1, received.seq, len(redelivered),
                 len(self.spool.seen), self.acked_total)
