"""StompSink's markers: the PUBLISHED records that say a participant's batch was sent.

``<staging_dir>/published/<participant id>.json`` holds ``{"batch": N, "txn": id}``,
written whole once every message of the participant's batch N is confirmed (a
temporary name moved over the record: atomic on POSIX and HDFS; on an object store the
move is one ``PUT``). One record per pooled participant ID: its slot is reused two
batches later, once batch N is finished and never committed again. A retried commit, a
recovery probe and the lost-checkpoint check read them; the broker itself records
nothing sparkeos can ask.
"""

from __future__ import annotations

import json
import posixpath
import re
import uuid

from sparkeos.core.protocol import Transaction
from sparkeos.core.staging import StagingArea

PUBLISHED_DIR = "published"


def _record(staging: StagingArea, txn: Transaction) -> str:
    return posixpath.join(staging.path, PUBLISHED_DIR, f"{txn.participant_id}.json")


def published_batch(staging: StagingArea, txn: Transaction) -> int:
    """The last batch published for the participant (-1 if none)."""
    try:
        return int(json.loads(staging.files.read(_record(staging, txn)))["batch"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def is_published(staging: StagingArea, txn: Transaction) -> bool:
    """The transaction's batch (or a later one of its participant) was published."""
    return published_batch(staging, txn) >= txn.batch_id


def mark_published(staging: StagingArea, txn: Transaction, fsync: bool) -> None:
    files, final = staging.files, _record(staging, txn)
    files.makedirs(posixpath.dirname(final))
    temp = f"{final}.{uuid.uuid4().hex}.tmp"
    files.create_new(temp, json.dumps({"batch": txn.batch_id, "txn": txn.txn_id}).encode())
    if fsync:
        files.make_durable(temp)
    files.replace(temp, final)
    if fsync:
        files.make_durable(posixpath.dirname(final))


def other_queries(staging: StagingArea, query_key: str, sink: str) -> str | None:
    """PUBLISHED records of sink name ``sink`` under query keys other than
    ``query_key`` (a lost checkpoint), described; None if there are none."""
    directory = posixpath.join(staging.path, PUBLISHED_DIR)
    names = staging.files.listdir(directory)
    pattern = re.compile(r"^seos-([^-]+)-" + re.escape(sink) + r"-p\d+-s\d+\.json$")
    others = sorted({m.group(1) for m in map(pattern.match, names)
                     if m and m.group(1) != query_key})
    if not others:
        return None
    return (f"PUBLISHED records in {staging.files.uri(directory)} of query keys "
            f"{', '.join(others)}")
