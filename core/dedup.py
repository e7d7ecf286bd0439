"""Seen-ID store for acknowledging sources (Jet's JMS source deduplication).

An acknowledging source acks messages in phase 2. If the query dies after a batch
was decided but before the ack reached the broker, the broker redelivers messages
that were already processed. The source remembers the stable IDs of the messages it
emitted, persisted with each batch, and drops redeliveries until their ack is
confirmed; then the IDs are forgotten, so the store stays bounded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from sparkeos.core.snapshot.commitlog import Store

from .errors import ConfigurationError

_SNAPSHOT = re.compile(r"^seen-ids\.(\d{20})\.json$")


class SeenIds:
    """Message IDs emitted per batch and not yet confirmed as acknowledged."""

    def __init__(self, max_ids: int = 1_000_000) -> None:
        if max_ids < 1:
            raise ConfigurationError(f"max_ids={max_ids} must be >= 1")
        self.max_ids = max_ids
        self._by_batch: dict[int, dict[str, None]] = {}  # ordered sets
        self._index: dict[str, int] = {}

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._index

    def __len__(self) -> int:
        return len(self._index)

    def filter_new(self, message_ids: Iterable[str]) -> list[str]:
        """The IDs not seen before, in order, without repeats within the input."""
        fresh: list[str] = []
        local: set[str] = set()
        for mid in message_ids:
            if mid not in self._index and mid not in local:
                local.add(mid)
                fresh.append(mid)
        return fresh

    def add(self, batch_id: int, message_ids: Iterable[str]) -> None:
        ids = [m for m in message_ids if m not in self._index]
        if len(self._index) + len(ids) > self.max_ids:
            raise ConfigurationError(
                f"the seen-ID store would hold {len(self._index) + len(ids)} IDs, over its "
                f"bound of {self.max_ids}; acknowledgements are not being confirmed",
                batch_id=batch_id,
                fix="check that the source's commit (ack) reaches the broker, or raise "
                "max_ids; dropping IDs instead would let redeliveries through as duplicates",
            )
        self._by_batch.setdefault(batch_id, {}).update(dict.fromkeys(ids))
        for mid in ids:
            self._index[mid] = batch_id

    def batch_of(self, message_id: str) -> int | None:
        """The batch (or offset) the ID was recorded under, or None if unseen."""
        return self._index.get(message_id)

    def discard(self, message_ids: Iterable[str]) -> int:
        """Forget single IDs (their ack was confirmed); return how many were known."""
        dropped = 0
        for mid in message_ids:
            batch = self._index.pop(mid, None)
            if batch is None:
                continue
            dropped += 1
            ids = self._by_batch.get(batch)
            if ids is not None:
                ids.pop(mid, None)
                if not ids:
                    del self._by_batch[batch]
        return dropped

    def forget_after(self, batch_id: int) -> int:
        """Forget the IDs of batches ``> batch_id`` (recorded, then never planned)."""
        dropped = 0
        for batch in [b for b in self._by_batch if b > batch_id]:
            for mid in self._by_batch.pop(batch):
                self._index.pop(mid, None)
                dropped += 1
        return dropped

    def ids_through(self, batch_id: int) -> list[str]:
        """The IDs of batches ``<= batch_id``."""
        return [m for b, ids in self._by_batch.items() if b <= batch_id for m in ids]

    def oldest_batch(self) -> int | None:
        return min(self._by_batch, default=None)

    def acknowledged(self, through_batch: int) -> int:
        """Forget the IDs of batches ``<= through_batch``; return how many."""
        dropped = 0
        for batch in [b for b in self._by_batch if b <= through_batch]:
            for mid in self._by_batch.pop(batch):
                self._index.pop(mid, None)
                dropped += 1
        return dropped

    # -- persistence --------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        data = {"max_ids": self.max_ids,
                "batches": {str(b): list(ids) for b, ids in sorted(self._by_batch.items())}}
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> SeenIds:
        data = json.loads(raw)
        seen = cls(int(data["max_ids"]))
        for batch, ids in data["batches"].items():
            seen.add(int(batch), ids)
        return seen

    def save(self, store: Store, batch_id: int) -> None:
        """Persist as of ``batch_id`` (write-once), then drop older snapshots."""
        store.write_new(f"seen-ids.{batch_id:020d}.json", self.to_bytes())
        for name in store.list_names():
            match = _SNAPSHOT.match(name)
            if match and int(match.group(1)) < batch_id:
                store.delete(name)

    @classmethod
    def load(cls, store: Store, max_ids: int = 1_000_000,
             at_most_batch: int | None = None) -> SeenIds:
        """The latest snapshot (at or before ``at_most_batch``), or an empty store."""
        snapshots = sorted(
            int(m.group(1)) for m in map(_SNAPSHOT.match, store.list_names()) if m
        )
        if at_most_batch is not None:
            snapshots = [b for b in snapshots if b <= at_most_batch]
        if not snapshots:
            return cls(max_ids)
        return cls.from_bytes(store.read(f"seen-ids.{snapshots[-1]:020d}.json"))
