"""``sparkeos status`` and ``recover`` for a real-time writer (``exactly_once_writer``):
what it recorded in the checkpoint (``core.streaming.epochrecord``), each partition's
last committed mark, and the fence that ends what a dead attempt left open."""

from __future__ import annotations

import json
from typing import Any

from sparkeos.core.errors import QueryRunningError
from sparkeos.core.snapshot.group import load_recorded_sink
from sparkeos.core.streaming import epochrecord, identity


def is_realtime(meta: dict[str, Any] | None) -> bool:
    return (meta or {}).get("route") == epochrecord.ROUTE


def _participant(meta: dict[str, Any], overrides: dict[str, str]) -> tuple[Any, Any]:
    sink = load_recorded_sink(meta, overrides)
    return sink, sink.epoch_participant()


def status(checkpoint: str, name: str, names: list[str], meta: dict[str, Any],
           overrides: dict[str, str], probe: bool) -> dict[str, Any]:
    query = identity.of_checkpoint(checkpoint)
    partitions = epochrecord.recorded_partitions(names)
    entry: dict[str, Any] = {
        "sink": name, "route": epochrecord.ROUTE, "type": meta.get("sink_type"),
        "destination": meta.get("identity"), "query_key": query.key if query.durable else None,
        "last_recorded_epoch": epochrecord.last_recorded_epoch(checkpoint),
        "partitions": partitions}
    if probe and query.durable:
        try:
            sink, participant = _participant(meta, overrides)
            try:
                marks = epochrecord.marks(participant, query.pool(name), partitions)
            finally:
                sink.close()
            entry["marks"] = {str(p): m for p, m in marks.items()}
        except Exception as exc:  # status must still print the rest
            entry["probe_error"] = f"{type(exc).__name__}: {exc}"
    return entry


def print_status(entry: dict[str, Any]) -> None:
    print(f"sink {entry['sink']}  ({entry['type']}, real-time writer)  "
          f"query {entry['query_key']}")
    print(f"  destination: {json.dumps(entry['destination'])}")
    print(f"  last epoch Spark recorded: {entry['last_recorded_epoch']}")
    print(f"  partitions opened: {len(entry['partitions'])}")
    for partition, mark in sorted(entry.get("marks", {}).items(), key=lambda i: int(i[0])):
        if mark is None:
            print(f"    partition {partition}: nothing committed")
        else:
            by = mark.get("by") or {}
            print(f"    partition {partition}: epoch {mark.get('epoch')} committed up to row "
                  f"{mark.get('end')} (run {by.get('run')}, task {by.get('task')})")
    if "probe_error" in entry:
        print(f"    probe: {entry['probe_error']}")
    print("  in doubt: an epoch transaction a dead attempt left open, if any (it holds "
          "read_committed readers back until the destination times it out); "
          "`sparkeos recover --force` ends it once the query is stopped")


def recover(checkpoint: str, name: str, names: list[str], meta: dict[str, Any],
            overrides: dict[str, str], force: bool, dry_run: bool) -> list[str]:
    """Fence every recorded partition of the writer (both slots); what was done, as lines."""
    query = identity.of_checkpoint(checkpoint)
    partitions = epochrecord.recorded_partitions(names)
    if not partitions:
        return [f"sink {name}: no partition opened; nothing to recover"]
    if dry_run:
        return [f"sink {name}: would fence partitions {partitions} (both slots), rolling "
                "back any epoch transaction left open"]
    if not force:
        raise QueryRunningError(
            f"sink {name} is written by a real-time writer, which leaves no lease: whether "
            "its query runs cannot be told, and fencing a running query fails its epoch",
            sink=name, fix="stop the query, then run `sparkeos recover --force` (a "
            "restarted query fences the same transactions by itself)")
    query.require(name)
    sink, participant = _participant(meta, overrides)
    try:
        fenced = epochrecord.fence_partitions(participant, query.pool(name), partitions)
    finally:
        sink.close()
    return [f"sink {name}: fenced {len(fenced)} participants of partitions {partitions}; "
            "any epoch transaction a dead attempt left open is rolled back"]


__all__ = ["is_realtime", "print_status", "recover", "status"]
