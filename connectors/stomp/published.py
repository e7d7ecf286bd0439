"""StompSink's markers: the PUBLISHED records that say a participant's batch was sent.

``<staging_dir>/published/<participant id>.json`` holds ``{"batch": N, "txn": id}``,
written atomically once every message of the participant's batch N is confirmed. One
file per pooled participant ID: its slot is reused two batches later, once batch N is
finished and never committed again. A retried commit, a recovery probe and the
lost-checkpoint check read them; the broker itself records nothing sparkeos can ask.
"""

from __future__ import annotations

import json
import os
import re

from sparkeos.core.fsutil import write_atomically
from sparkeos.core.protocol import Transaction

PUBLISHED_DIR = "published"


def _record(root: str, txn: Transaction) -> str:
    return os.path.join(root, PUBLISHED_DIR, f"{txn.participant_id}.json")


def published_batch(root: str, txn: Transaction) -> int:
    """The last batch published for the participant (-1 if none)."""
    try:
        with open(_record(root, txn), "rb") as fh:
            return int(json.loads(fh.read())["batch"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def is_published(root: str, txn: Transaction) -> bool:
    """The transaction's batch (or a later one of its participant) was published."""
    return published_batch(root, txn) >= txn.batch_id


def mark_published(root: str, txn: Transaction, fsync: bool) -> None:
    final = _record(root, txn)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    write_atomically(final, json.dumps({"batch": txn.batch_id, "txn": txn.txn_id}).encode(),
                     fsync=fsync)


def other_queries(root: str, query_key: str, sink: str) -> str | None:
    """PUBLISHED records of sink name ``sink`` under query keys other than
    ``query_key`` (a lost checkpoint), described; None if there are none."""
    directory = os.path.join(root, PUBLISHED_DIR)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return None
    pattern = re.compile(r"^seos-([^-]+)-" + re.escape(sink) + r"-p\d+-s\d+\.json$")
    others = sorted({m.group(1) for m in map(pattern.match, names)
                     if m and m.group(1) != query_key})
    if not others:
        return None
    return f"PUBLISHED records in {directory} of query keys {', '.join(others)}"
