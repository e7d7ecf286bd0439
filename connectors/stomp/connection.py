"""The acknowledging source's broker connection: its lifecycle (connect and subscribe,
drop, close) and what is only valid on it (the ack handles of the messages it
delivered, and the pulls it spooled that no batch took yet).

A dropped connection voids its ack handles: the broker delivers its unacknowledged
messages again, and their stable IDs tell the redeliveries apart. Acknowledgements are
ACK frames confirmed by a RECEIPT, never inside a STOMP transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .client import ARTEMIS, CLASSIC, RABBITMQ, ConnectionLost, StompClient
from .sourceconfig import StompSourceConfig

log = logging.getLogger("sparkeos.stomp.source")


class Connection:
    """The runner process's connection to the broker (not thread-safe)."""

    def __init__(self, config: StompSourceConfig) -> None:
        self.config = config
        self.client: StompClient | None = None
        self.kind: str | None = None
        self.acks: dict[str, str] = {}
        """Message ID -> ack handle, for messages delivered on the live connection."""
        self.live_pulls: set[str] = set()
        """Pulls spooled by this process (their messages are unacked on this connection)."""

    def open(self) -> StompClient:
        """The live client, connected and subscribed anew if the last one dropped."""
        if self.client is not None and self.client.connected:
            return self.client
        # A new connection: the old one's ack handles are void and its unacked messages
        # come again (recognised by ID).
        self.drop()
        config = self.config
        client = StompClient(config.endpoint, timeout_s=config.timeout_s,
                             heartbeats=config.heartbeats, ssl_options=config.ssl_options,
                             connect_headers=config.connect_headers).connect()
        self.kind = client.kind
        try:
            client.subscribe(config.destination, "sparkeos-source", "client-individual",
                             self._subscribe_headers())
        except BaseException:
            client.close()
            raise
        self.client = client
        return client

    def _subscribe_headers(self) -> dict[str, str]:
        """Each broker's prefetch setting, sized to hold a spooled and a new batch."""
        config = self.config
        headers: dict[str, str] = {}
        if config.subscription_type and self.kind == ARTEMIS:
            headers["subscription-type"] = config.subscription_type
            headers["consumer-window-size"] = "-1"
        elif self.kind == CLASSIC:
            headers["activemq.prefetchSize"] = str(2 * config.max_batch_messages)
        elif self.kind == RABBITMQ:
            headers["prefetch-count"] = str(2 * config.max_batch_messages)
        return headers

    def ack(self, handles: Sequence[str]) -> bool:
        """ACK each handle; the RECEIPT of the last confirms them all (a connection
        processes frames in order). False if the connection dropped first (a broker
        restart): its handles are void, the broker sends the messages again, and
        their IDs, still recorded, tell them apart (acknowledged then)."""
        client = self.client
        if client is None or not client.connected:
            self.drop()
            return False
        receipt = client.new_receipt()
        try:
            for i, handle in enumerate(handles):
                client.ack(handle, receipt=receipt if i == len(handles) - 1 else None)
            client.wait_receipt(receipt, f"the acknowledgement of {len(handles)} messages")
        except ConnectionLost as exc:
            log.warning("stomp source %s: %s; the unconfirmed messages come again and are "
                        "recognised by their IDs", self.config.source_name, exc)
            self.drop()
            return False
        return True

    def drop(self) -> None:
        """Forget the connection and everything only valid on it."""
        self.close()
        self.acks.clear()
        self.live_pulls.clear()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
