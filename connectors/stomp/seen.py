"""The upkeep of the acknowledging source's seen-ID store (``spool.seen``): when the
IDs of acknowledged messages are forgotten, so the store stays within
``max_seen_ids`` while every redelivery the broker may still owe is recognised.

The broker's own message IDs name one message, which cannot come again once
acknowledged; IDs from a producer's header (``message_id_header``/``message_id_fn``)
may name several copies and are kept as long as the bound allows.
"""

from __future__ import annotations

import logging
from collections.abc import Container

from .sourceconfig import StompSourceConfig
from .spool import Spool

log = logging.getLogger("sparkeos.stomp.source")


def _broker_ids(config: StompSourceConfig) -> bool:
    return config.message_id_header is None and config.message_id_fn is None


def forget_acknowledged(spool: Spool, config: StompSourceConfig, acknowledged: list[str],
                        committed: int) -> None:
    """IDs whose ack is confirmed: broker IDs are forgotten at once; a producer's
    header IDs stay for the bound, oldest committed batches dropped first."""
    seen = spool.seen
    if _broker_ids(config):
        seen.discard(acknowledged)
    else:
        room = seen.max_ids - 2 * config.max_batch_messages
        while len(seen) > room:
            oldest = seen.oldest_batch()
            if oldest is None or oldest > committed:
                break
            seen.acknowledged(oldest)
    spool.save_seen()


def forget_orphans(spool: Spool, config: StompSourceConfig, committed: int,
                   unacked: Container[str], redelivered_now: Container[str]) -> None:
    """A new message arrived: every processed message the broker still held
    unacknowledged was redelivered before it (brokers redeliver unacknowledged
    messages ahead of new ones, at the head of the queue). So a processed ID with no
    ack handle on this connection (``unacked``), not redelivered by now, was
    acknowledged: its ACK reached the broker on an earlier connection but the RECEIPT
    did not come back (the connection dropped, or this process restarted). Forget it;
    kept, such IDs would fill the store until the source halts. Broker message IDs
    only: a producer's header ID may come again as a copy, and stays for the bound."""
    if not _broker_ids(config):
        return
    orphans = [mid for mid in spool.seen.ids_through(committed)
               if mid not in unacked and mid not in redelivered_now]
    if orphans:
        spool.seen.discard(orphans)
        spool.save_seen()
        log.info("stomp source %s: forgot %d IDs whose acknowledgement was sent but "
                 "not confirmed (not redelivered before new messages)",
                 config.source_name, len(orphans))
