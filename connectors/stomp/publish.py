"""Phase 2 of StompSink: sending a staged file's messages with their duplicate IDs.

Every message goes out ``persistent:true`` with a deterministic ID from (query, sink,
batch, partition, position), on one connection opened for the participant; a RECEIPT
on the last send confirms them all. The sends are deliberately not one STOMP
transaction (see the ``sink`` module doc): plain sends are checked one by one by the
broker's duplicate detection, so a re-publish adds exactly the messages that are
missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from sparkeos.core.fingerprint import Written
from sparkeos.core.protocol import Transaction
from sparkeos.core.staging import StagingArea

from .client import StompClient
from .staging import staged_messages

Frame = tuple[str, bytes, dict[str, str]]


def message_id_stem(txn: Transaction, written: Written | None = None) -> str:
    """The duplicate IDs of the participant's messages are this plus their position.
    It names what the participant holds (its fingerprint): a re-send of the same rows
    reuses every ID (the broker drops them), a replay whose partition holds other rows
    (partitioned otherwise) never reuses an ID of rows it does not hold."""
    content = f"{written.fingerprint[:16]}-" if written is not None else ""
    return f"seos-{txn.query_key}-{txn.sink}-b{txn.batch_id}-p{txn.partition}-{content}"


def fixed_headers(headers: Mapping[str, str], destination_type: str | None) -> dict[str, str]:
    """The headers every message gets (the user's fixed ones, then the sink's)."""
    fixed = dict(headers)
    fixed["persistent"] = "true"
    if destination_type:
        fixed["destination-type"] = destination_type
    return fixed


def frames(staging: StagingArea, path: str, default: str | None, fixed: Mapping[str, str],
           id_header: str, stem: str) -> Iterator[Frame]:
    """The frames to send for a staged file: its headers, the fixed ones, the ID."""
    staged = staged_messages(staging, path, default)
    for position, (destination, body, headers) in enumerate(staged):
        yield destination, body or b"", {**(headers or {}), **fixed,
                                         id_header: f"{stem}{position}"}


def publish(connect: Callable[[], StompClient], txn: Transaction,
            messages: Iterator[Frame]) -> None:
    """Send ``messages`` on a connection of their own and wait for the last RECEIPT."""
    with connect() as client:
        client.send_all(messages, f"participant {txn.participant_id}")
