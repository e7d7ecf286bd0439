"""What a real-time writer leaves in its query's checkpoint, for ``sparkeos status`` and
``sparkeos recover``: no commit log (no driver decides an epoch), but

- ``<checkpoint>/sparkeos/<name>/sink.json``: the route (``realtime``), the sink's type,
  description and destination, written on the driver when the writer is made;
- ``<checkpoint>/sparkeos/<name>/realtime-partition-<p>``: one empty file per partition
  a task of the writer opened (written once per process and partition), so the
  participants to look at are known even where none has committed yet.

What a real-time query leaves in doubt is an epoch transaction a dead attempt left open
(Kafka: readers with ``read_committed`` wait behind it until the broker's transaction
timeout). ``fence_partitions`` ends them the way a restarted query would: it fences each
partition's participant in both slots of the two-ID pool (``fence_epoch``), which rolls
back what every older attempt left open.
"""

from __future__ import annotations

import json
import time
from typing import Any

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.protocol import EpochParticipant, JsonDict, TransactionalSink
from sparkeos.core.snapshot.commitlog import META
from sparkeos.core.snapshot.txpool import TransactionPool
from sparkeos.core.storage.registry import split_uri

ROUTE = "realtime"
PARTITION_PREFIX = "realtime-partition-"
_RECORDED: set[tuple[str, str, str, int]] = set()
"""(checkpoint, query key, sink, partition) this process has recorded: once per
process and query (a checkpoint replaced at the same path is another query)."""


def sink_directory(checkpoint: str, name: str) -> str:
    return f"{checkpoint.rstrip('/')}/sparkeos/{name}"


def record_writer(checkpoint: str, name: str, sink: TransactionalSink[Any]) -> None:
    """Record (or refresh) the writer's description; refuse a name the query's
    micro-batch route already uses in this checkpoint."""
    files, directory = split_uri(sink_directory(checkpoint, name))
    meta_path = f"{directory}/{META}"
    mine = {"route": ROUTE, "sink_name": name, "sink_type": sink.type_name,
            "identity": sink.identity(), "description": sink.describe()}
    if files.exists(meta_path):
        recorded = json.loads(files.read(meta_path))
        if recorded.get("route") != ROUTE:
            raise ConfigurationError(
                f"the sink name {name!r} already has a micro-batch commit log in the "
                f"checkpoint {checkpoint}: one name is written by one route",
                sink=name, fix="give the real-time writer another name, or a query (and "
                "checkpoint) of its own")
        if all(recorded.get(key) == value for key, value in mine.items()):
            return
    files.makedirs(directory)
    files.overwrite(meta_path, json.dumps({**mine, "recorded": time.time()}).encode())


def record_partition(checkpoint: str, query_key: str, name: str, partition: int) -> None:
    key = (checkpoint, query_key, name, partition)
    if key in _RECORDED:
        return
    files, directory = split_uri(sink_directory(checkpoint, name))
    path = f"{directory}/{PARTITION_PREFIX}{partition}"
    if not files.exists(path):
        files.makedirs(directory)
        files.overwrite(path, b"")
    _RECORDED.add(key)


def recorded_partitions(names: list[str]) -> list[int]:
    """The partitions among the names of a writer's directory."""
    return sorted(int(n[len(PARTITION_PREFIX):]) for n in names
                  if n.startswith(PARTITION_PREFIX) and n[len(PARTITION_PREFIX):].isdigit())


def last_recorded_epoch(checkpoint: str) -> int | None:
    """The last epoch Spark recorded as done (``<checkpoint>/commits/<epoch>``)."""
    files, path = split_uri(checkpoint)
    directory = f"{path.rstrip('/')}/commits"
    if not files.exists(directory):
        return None
    epochs = [int(n) for n in files.listdir(directory) if n.isdigit()]
    return max(epochs) if epochs else None


def marks(participant: EpochParticipant[Any], pool: TransactionPool,
          partitions: list[int]) -> dict[int, JsonDict | None]:
    """Each partition's last committed mark, read without fencing (a partition has
    one mark, whichever slot committed it)."""
    return {partition: participant.peek_mark(pool.transaction(0, partition, 0, 0))
            for partition in partitions}


def fence_partitions(participant: EpochParticipant[Any], pool: TransactionPool,
                     partitions: list[int]) -> list[str]:
    """Fence every attempt of each partition, in both slots, and roll back what they
    left open; the participant IDs fenced."""
    fenced = []
    for partition in partitions:
        for epoch in (0, 1):
            txn = pool.transaction(epoch, partition, 0, 0)
            participant.fence_epoch(txn)
            fenced.append(txn.participant_id)
    return fenced


__all__ = ["PARTITION_PREFIX", "ROUTE", "fence_partitions", "last_recorded_epoch", "marks",
           "record_partition", "record_writer", "recorded_partitions", "sink_directory"]
