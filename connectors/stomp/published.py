"""StompSink's markers: the PUBLISHED records that say a participant's batch was sent.

``<staging_dir>/published/<participant id>.json`` holds ``{"batch": N, "txn": id,
"rows": ..., "fingerprint": ...}`` (what was sent, ``core.snapshot.fingerprint``), written whole
once every message of the participant's batch N is confirmed (a
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
from sparkeos.core.snapshot.fingerprint import Written
from sparkeos.core.snapshot.replay import OnRecord, committed_before
from sparkeos.core.storage.staging import StagingArea

PUBLISHED_DIR = "published"


def _record(staging: StagingArea, txn: Transaction) -> str:
    return posixpath.join(staging.path, PUBLISHED_DIR, f"{txn.participant_id}.json")


def published_batch(staging: StagingArea, txn: Transaction) -> int:
    """The last batch published for the participant (-1 if none)."""
    return published_record(staging, txn)[0]


def published_record(staging: StagingArea, txn: Transaction) -> tuple[int, Written | None]:
    """The last batch published for the participant (-1 if none) and what was sent."""
    on = on_record(staging, txn)
    return on.batch, next(iter(on.written), None)


def on_record(staging: StagingArea, txn: Transaction) -> OnRecord:
    """The participant's PUBLISHED record as the replay rule reads it: the batch, what
    was sent and the attempt that sent it."""
    try:
        record = json.loads(staging.files.read(_record(staging, txn)))
        return OnRecord.last_batch(int(record["batch"]), Written.from_json(record),
                                   str(record.get("txn") or "") or None)
    except (FileNotFoundError, ValueError, KeyError):
        return OnRecord.nothing()


def is_published(staging: StagingArea, txn: Transaction, written: Written | None) -> bool:
    """The decided transaction's batch was published with these rows, or a later batch
    of its participant was (``core.snapshot.replay.committed_before``)."""
    return committed_before(txn, written, on_record(staging, txn))


def mark_published(staging: StagingArea, txn: Transaction, fsync: bool,
                   written: Written | None = None) -> None:
    files, final = staging.files, _record(staging, txn)
    files.makedirs(posixpath.dirname(final))
    temp = f"{final}.{uuid.uuid4().hex}.tmp"
    record = {"batch": txn.batch_id, "txn": txn.txn_id,
              **(written.as_json() if written else {})}
    files.create_new(temp, json.dumps(record).encode())
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
