"""What StompSink checks before it writes: the broker once per process (login, and
duplicate detection where the sink relies on it), and each batch against the broker's
duplicate-ID cache before the decision.

Both refusals come before anything of the batch is sent, so the fix they name can be
applied and the query restarted with nothing to undo.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from sparkeos.core.errors import ConfigurationError

from .client import ARTEMIS, Endpoint, StompClient

_checked: dict[str, str] = {}
_checked_lock = threading.Lock()


def check_broker(endpoint: Endpoint, connect: Callable[[], StompClient],
                 duplicate_detection: str, dedup_header: str) -> str:
    """Log in once per process and configuration; refuse ``duplicate_detection=
    "broker"`` on a broker without duplicate detection. Returns the broker kind."""
    key = f"{endpoint.address}|{endpoint.login}|{duplicate_detection}"
    with _checked_lock:
        if key in _checked:
            return _checked[key]
    with connect() as client:
        kind, server = client.kind, client.server
    if duplicate_detection == "broker" and kind != ARTEMIS:
        raise ConfigurationError(
            f"the STOMP broker at {endpoint.address} ({server or 'unknown server'}) "
            "has no duplicate detection, so a batch re-published after a crash would "
            "reach the queue twice",
            fix="use ActiveMQ Artemis; or StompSink(duplicate_detection='consumer') if "
            f"every consumer drops duplicates by the {dedup_header!r} header (a "
            "sparkeos stomp_source does); or duplicate_detection='none' with "
            "at_least_once(sink, ...); nothing was written",
        )
    with _checked_lock:
        _checked[key] = kind
    return kind


def check_id_cache(batch_id: int, receipts: Iterable[Any], id_cache_size: int) -> None:
    """Refuse a batch that sends more messages to one address than the broker's
    duplicate-ID cache holds: after a crash, a re-publish could find the first
    messages' IDs already evicted."""
    per_address: dict[str, int] = {}
    for receipt in receipts:
        for address, count in (receipt.get("destinations") or {}).items():
            per_address[address] = per_address.get(address, 0) + int(count)
    over = {a: n for a, n in per_address.items() if n > id_cache_size}
    if not over:
        return
    address, count = max(over.items(), key=lambda item: item[1])
    raise ConfigurationError(
        f"batch {batch_id} would send {count} messages to {address!r}, more than "
        f"the broker's duplicate-ID cache holds (id_cache_size={id_cache_size})"
        ": after a crash, a re-publish could find the first IDs evicted and "
        "duplicate them",
        batch_id=batch_id,
        fix="raise id-cache-size in the broker's address-settings for this address "
        "and StompSink(id_cache_size=...) to match, then restart (the batch is "
        "written then); and bound the source's batch size (maxOffsetsPerTrigger, "
        "stomp_source(max_batch_messages=...)); nothing of this batch was sent",
    )
