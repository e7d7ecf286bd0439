"""What the acknowledging source makes of a received message: its stable ID (how a
redelivery is told from a new message), the check of its body against
``body_format``, the dead-letter move of one that fails it, and its spooled row.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
from collections.abc import Mapping
from typing import Any

from sparkeos.core.errors import BadMessageError

from .client import ARTEMIS, CLASSIC, StompClient
from .sourceconfig import StompSourceConfig

log = logging.getLogger("sparkeos.stomp.source")

_NOT_FORWARDED = ("ack", "subscription", "message-id", "destination", "content-length",
                  "redelivered", "receipt")


def stable_id(config: StompSourceConfig, kind: str | None,
              headers: Mapping[str, str]) -> str | None:
    """The message's ID that stays the same on redelivery (None only with
    ``require_ids=False``): from ``message_id_fn``, ``message_id_header``, or the
    broker's ``message-id`` where the broker (``kind``) keeps it stable."""
    if config.message_id_fn is not None:
        value = config.message_id_fn(headers)
    elif config.message_id_header:
        value = headers.get(config.message_id_header)
    elif kind == ARTEMIS:
        raw = headers.get("message-id", "")
        value = raw.split(",", 1)[1] if "," in raw else raw
    elif kind == CLASSIC:
        value = headers.get("message-id")
    else:
        value = None
    if value:
        return str(value)
    if not config.require_ids:
        return None
    where = (f"header {config.message_id_header!r}" if config.message_id_header
             else "message_id_fn" if config.message_id_fn
             else f"the broker's message-id ({kind} changes it on redelivery)")
    raise BadMessageError(
        f"a message on {config.destination!r} has no stable ID in {where} "
        f"(message-id {headers.get('message-id')!r}); without one a redelivery cannot "
        "be told from a new message",
        fix="set stomp_source(message_id_header='<a header your producers set>') (a "
        "sparkeos StompSink sets 'sparkeos-dedup-id') or message_id_fn=...; or "
        "require_ids=False for at-least-once; the message was not acknowledged",
    )


def body_problem(body_format: str, body: bytes) -> str | None:
    """Why ``body`` cannot be read as ``body_format`` (None if it can)."""
    if body_format == "binary":
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"the body is not UTF-8 ({exc.reason} at byte {exc.start})"
    if body_format == "json":
        try:
            json.loads(text)
        except ValueError as exc:
            return f"the body is not JSON ({exc})"
    return None


def dead_letter(config: StompSourceConfig, client: StompClient, message_id: str | None,
                headers: Mapping[str, str], body: bytes, problem: str) -> None:
    """Send a message that fails ``problem`` to the dead-letter destination (confirmed
    by a RECEIPT; the caller acknowledges the original), or raise ``BadMessageError``
    with ``on_bad_message="fail"`` (the message stays on the broker)."""
    if config.on_bad_message == "fail":
        raise BadMessageError(
            f"message {message_id!r} on {config.destination!r} cannot be read as "
            f"body_format={config.body_format!r}: {problem}",
            fix="stomp_source(on_bad_message='dead-letter', dead_letter_destination="
            "'<queue>') to move such messages aside, or body_format='binary'; the "
            "message was not acknowledged, the broker keeps it",
        )
    assert config.dead_letter_destination is not None
    forwarded = {k: v for k, v in headers.items() if k not in _NOT_FORWARDED}
    forwarded.update({"persistent": "true", "sparkeos-error": problem[:200],
                      "sparkeos-original-destination": config.destination})
    if message_id is not None:
        forwarded["sparkeos-message-id"] = message_id
        forwarded["_AMQ_DUPL_ID"] = f"seos-dlq-{message_id}"
    receipt = client.new_receipt()
    client.send(config.dead_letter_destination, body, forwarded, receipt=receipt)
    client.wait_receipt(receipt, "the dead-letter send")


def moved_aside(config: StompSourceConfig, message_id: str | None, problem: str) -> None:
    log.warning("stomp source %s: message %r moved to %s: %s", config.source_name,
                message_id, config.dead_letter_destination, problem)


def row(seq: int, message_id: str | None, headers: Mapping[str, str], body: bytes,
        default_destination: str) -> dict[str, Any]:
    """The spooled row of a message (``spool.SPOOL_SCHEMA``)."""
    return {"seq": seq, "message_id": message_id,
            "destination": headers.get("destination", default_destination),
            "headers": headers, "body": body, "timestamp": timestamp(headers)}


def timestamp(headers: Mapping[str, str]) -> datetime.datetime:
    raw = headers.get("timestamp")
    if raw is not None:
        with contextlib.suppress(ValueError, OverflowError, OSError):
            return datetime.datetime.fromtimestamp(int(raw) / 1000, tz=datetime.timezone.utc)
    return datetime.datetime.now(tz=datetime.timezone.utc)
