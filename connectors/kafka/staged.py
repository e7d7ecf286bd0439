"""Staged mode's files: where a task attempt keeps its prepared records until phase 2.

Phase 1 serialises the partition's records into an Arrow IPC file
``<staging_dir>/<prefix><attempt txn id>/records.arrow`` (a directory each attempt
claims exclusively) and makes it durable; the receipt names it. Phase 2 opens the
decided attempt's file (``staged_path``); a file that is gone although the marker says
"not committed" is data loss, reported with what to do. Where the directory is
(``staging_dir``, ``$SPARKEOS_KAFKA_STAGING_DIR`` or under the query's checkpoint) is
decided here too; listing, claiming and sweeping are ``core.storage.staging.StagingArea``'s.
"""

from __future__ import annotations

import os
import posixpath
import socket
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import DataLossError
from sparkeos.core.protocol import Receipt, Transaction
from sparkeos.core.snapshot.fingerprint import Written
from sparkeos.core.snapshot.replay import committed_before
from sparkeos.core.storage.staging import CHECKPOINT_STAGING as CHECKPOINT_STAGING
from sparkeos.core.storage.staging import StagingArea, default_dir
from sparkeos.core.storage.staging import checkpoint_staging_dir as checkpoint_staging_dir

from . import markers
from .config import STAGING_ENV, KafkaConfig
from .errors import PHASE2

STAGED_FILE = "records.arrow"
def default_staging_dir() -> str:
    """Where a sink not bound to a checkpoint stages (runners without Spark):
    ``$SPARKEOS_KAFKA_STAGING_DIR``, else ``~/.sparkeos/kafka-staging``."""
    return default_dir(STAGING_ENV, "kafka-staging")


def staging_area(config: KafkaConfig) -> StagingArea:
    """The sink's staging area, made once, where it is first asked (the driver's
    validate): an object store's endpoint is resolved there and travels to the tasks
    with the sink. Unbound (a runner without a checkpoint, e.g. in-process tests): this
    host's directory."""
    area: StagingArea | None = config.__dict__.get("_staging")
    if area is None:
        area = StagingArea(config.staging_dir or default_staging_dir(),
                           prefix=config.transactional_id_prefix,
                           setting=f"KafkaSink(staging_dir=...) / ${STAGING_ENV}")
        config.__dict__["_staging"] = area
    return area


@dataclass
class StagedFile:
    """The file an attempt is writing: opened with the first batch."""

    directory: str
    local_file: str | None = None
    """Where the staged file is written on this host (in ``directory`` on a POSIX
    staging_dir; a temporary file uploaded at prepare on HDFS)."""
    file: Any = None
    writer: Any = None

    def write(self, staging: StagingArea, records: pa.RecordBatch) -> None:
        if self.writer is None:
            self.local_file = staging.writable_file(self.directory, STAGED_FILE)
            self.file = pa.OSFile(self.local_file, "wb")
            self.writer = pa.ipc.new_file(self.file, records.schema)
        self.writer.write_batch(records)

    def seal(self, staging: StagingArea, written: Written, fsync: bool) -> Receipt:
        """Close, make durable and publish the file in the staging directory; the
        receipt names it (no file: the attempt wrote no rows) and what it holds."""
        if self.writer is None or self.local_file is None:
            staging.discard(self.directory, None)
            return {"mode": "staged", "file": None, "rows": 0}
        rows = written.rows
        self.writer.close()
        self.file.close()
        size = os.path.getsize(self.local_file)
        relative = staging.seal(self.directory, STAGED_FILE, self.local_file, fsync)
        return {"mode": "staged", "rows": rows, "bytes": size,
                "file": relative, "host": socket.gethostname(), "written": written.as_json()}

    def discard(self, staging: StagingArea) -> None:
        if self.writer is not None:
            for closable in (self.writer, self.file):
                try:
                    closable.close()
                except Exception:
                    pass
        staging.discard(self.directory, self.local_file)


def staged_path(config: KafkaConfig, txn: Transaction, receipt: Receipt) -> str | None:
    """The decided attempt's staged file; None if a twin commit (the driver and
    `recover --force`, a retried task) published it and deleted it since this one
    read the marker; ``DataLossError`` if it is gone and nobody committed it."""
    staging = staging_area(config)
    path = staging.staged_file(txn, receipt, config.transactional_id(txn))
    if path is not None:
        return path
    marker = markers.committed_marker(config, txn, PHASE2, recovering=True)
    if committed_before(txn, Written.from_json(receipt.get("written")), marker.on_record()):
        return None
    path = staging.files.uri(posixpath.join(staging.path, str(receipt["file"])))
    raise DataLossError(
        f"staged file {path} of a decided transaction is gone and the marker shows the "
        "transaction as not committed",
        sink=txn.sink, batch_id=txn.batch_id, txn_id=config.transactional_id(txn),
        fix="something deleted the staging directory: restore it from a backup, or "
        "re-process this batch from the source. If the query was stopped for longer "
        "than the brokers' offsets.retention.minutes, the marker may have expired after "
        f"the batch was committed: check the topic, and if the batch is there, mark it "
        f"done with `sparkeos recover` or by committing offset {txn.batch_id + 1} for "
        f"group {markers.marker_group(config, txn)!r} on {config.marker_topic}[0]",
    )
