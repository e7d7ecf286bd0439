"""Phase 2 of StompSink: sending a staged file's messages with their duplicate IDs.

Every message goes out ``persistent:true`` with a deterministic ID from (query, sink,
batch, partition, the participant's fingerprint, the message's own content and its
occurrence), on one connection opened for the participant; a RECEIPT
on the last send confirms them all. The sends are deliberately not one STOMP
transaction (see the ``sink`` module doc): plain sends are checked one by one by the
broker's duplicate detection, so a re-publish adds exactly the messages that are
missing.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterator, Mapping

from sparkeos.core.protocol import Transaction
from sparkeos.core.snapshot.fingerprint import Written
from sparkeos.core.storage.staging import StagingArea

from .client import StompClient
from .staging import staged_messages

Frame = tuple[str, bytes, dict[str, str]]


def message_id_stem(txn: Transaction, written: Written | None = None) -> str:
    """What the duplicate IDs of the participant's messages start with. It names what
    the participant holds (its fingerprint, of the multiset of rows): a re-send of the
    same rows, in any order, reuses every ID (the broker drops them), a replay whose
    partition holds other rows (partitioned otherwise) never reuses an ID of rows it
    does not hold."""
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
           id_header: str, stem: str, by_content: bool = True) -> Iterator[Frame]:
    """The frames to send for a staged file: its headers, the fixed ones, the ID.

    A message's ID is the stem, a digest of its own content (destination, body and
    headers) and how many messages of that content came before it: a replay of the
    same rows in another order (a shuffle upstream) gives each message the ID it had,
    where a position would give it the ID of another row, which the broker would then
    drop. ``by_content`` False: the position (receipts of an earlier sparkeos)."""
    staged = staged_messages(staging, path, default)
    seen: Counter[bytes] = Counter()
    for position, (destination, body, headers) in enumerate(staged):
        if by_content:
            digest = _content_digest(destination, body, headers)
            suffix = f"{digest.hex()}-{seen[digest]}"
            seen[digest] += 1
        else:
            suffix = str(position)
        yield destination, body or b"", {**(headers or {}), **fixed,
                                         id_header: f"{stem}{suffix}"}


def _content_digest(destination: str, body: bytes | None,
                    headers: Mapping[str, str] | None) -> bytes:
    content = hashlib.blake2b(digest_size=8)
    content.update(destination.encode() + b"\0")
    content.update(body or b"")
    for key, value in sorted((headers or {}).items()):
        content.update(b"\0" + key.encode() + b"\0" + str(value).encode())
    return content.digest()


def publish(connect: Callable[[], StompClient], txn: Transaction,
            messages: Iterator[Frame]) -> None:
    """Send ``messages`` on a connection of their own and wait for the last RECEIPT."""
    with connect() as client:
        client.send_all(messages, f"participant {txn.participant_id}")
