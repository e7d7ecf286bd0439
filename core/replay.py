"""The replay rule: a participant is skipped on a replay only when it is known to hold
the rows that were committed.

Spark replays a batch's input, not its partitioning: after a restart on fewer cores or
with another ``repartition``, partition ``p`` of the replay may hold other rows than
partition ``p`` of the run that committed. A connector that keeps a marker per (query,
sink, batch, partition) records with it what was written (``core.fingerprint.Written``)
and, on a replay, asks ``Replay``:

* ``same``: an earlier run committed exactly these rows for this (batch, partition):
  write nothing (the receipt says ``skipped``);
* otherwise write them again (at-least-once may duplicate, never lose). When something
  was on record but differs, the receipt carries ``Replay.receipt()`` and the driver
  reports it (``replay.nondeterministic``, ``BatchMetrics.replays_rewritten``).

The driver side (``note_replays``) reads what the tasks' receipts say.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .fingerprint import Written
from .observe import BatchMetrics, log_event

REPLAY_KEY = "replay"
"""The receipt field a participant that met an earlier commit of its (batch, partition)
fills with ``Replay.receipt()``."""


@dataclass(frozen=True)
class Replay:
    """What a participant wrote (``written``) against what earlier runs committed for
    its (batch, partition) (``recorded``; None for a commit whose content is unknown,
    such as a marker from before fingerprints were recorded)."""

    written: Written
    recorded: tuple[Written | None, ...]

    @classmethod
    def of(cls, written: Written, recorded: Iterable[Written | None]) -> Replay:
        return cls(written, tuple(recorded))

    @property
    def same(self) -> bool:
        """Skip only on an equal record: the one case where nothing can be lost."""
        return any(self.written.same_as(r) for r in self.recorded)

    @property
    def met_earlier_commit(self) -> bool:
        return bool(self.recorded)

    def receipt(self) -> dict[str, Any]:
        return {"same": self.same, "rows": self.written.rows,
                "recorded_rows": [None if r is None else r.rows for r in self.recorded]}


def note_replays(sink: str, query_key: str, batch_id: int,
                 results: Sequence[Mapping[str, Any]], metrics: BatchMetrics) -> None:
    """On the driver, after phase 1 (or a direct batch): count the participants that met
    an earlier commit of their (batch, partition), and report those whose rows differ
    from it (a replay partitioned otherwise, or a nondeterministic input)."""
    for result in results:
        receipt = result.get("receipt")
        replay = result.get(REPLAY_KEY) or (
            receipt.get(REPLAY_KEY) if isinstance(receipt, Mapping) else None)
        if not isinstance(replay, Mapping):
            continue
        if replay.get("same"):
            metrics.replays_skipped += 1
            continue
        metrics.replays_rewritten += 1
        log_event("replay.nondeterministic", logging.WARNING, query=query_key, sink=sink,
                  batch=batch_id, participant=result.get("partition"),
                  rows=replay.get("rows"), recorded_rows=replay.get("recorded_rows"),
                  detail="an earlier run committed other rows for this (batch, "
                  "partition): written again, rows both runs hold may be duplicated")


__all__ = ["REPLAY_KEY", "Replay", "note_replays"]
