"""The two-ID transaction pool (after Jet's TransactionPoolSnapshotUtility).

Each participant (query, sink, partition) owns exactly two transaction IDs, one per
slot; batch N uses slot ``N % 2``. IDs are deterministic, so a restarted query knows
every ID it may have to commit or roll back without asking the external system to
list its transactions, and the external system never accumulates more than two
transactions per participant.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .config import validate_sink_name
from .errors import CommitLogError
from .protocol import Transaction

POOL_SIZE = 2
TXN_PREFIX = "seos"


def query_key_for(query_id: str) -> str:
    """A short, stable key for a query (its Spark ID persists in the checkpoint)."""
    return hashlib.sha256(query_id.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class TransactionPool:
    query_key: str
    sink: str

    def __post_init__(self) -> None:
        validate_sink_name(self.sink)

    @staticmethod
    def slot_of(batch_id: int) -> int:
        return batch_id % POOL_SIZE

    def txn_id(self, partition: int, slot: int) -> str:
        if not 0 <= slot < POOL_SIZE:
            raise ValueError(f"slot {slot} outside the pool of {POOL_SIZE}")
        return f"{TXN_PREFIX}-{self.query_key}-{self.sink}-p{partition}-s{slot}"

    def transaction(self, batch_id: int, partition: int, attempt: str = "") -> Transaction:
        slot = self.slot_of(batch_id)
        return Transaction(
            txn_id=self.txn_id(partition, slot),
            query_key=self.query_key,
            sink=self.sink,
            batch_id=batch_id,
            partition=partition,
            slot=slot,
            attempt=attempt,
        )

    def transactions(self, batch_id: int, partitions: int) -> list[Transaction]:
        return [self.transaction(batch_id, p) for p in range(partitions)]

    def check_slot_free(self, batch_id: int, unresolved_batches: list[int]) -> None:
        """Refuse to start ``batch_id`` while another batch still holds its slot."""
        slot = self.slot_of(batch_id)
        holders = [b for b in unresolved_batches if b != batch_id and self.slot_of(b) == slot]
        if holders:
            raise CommitLogError(
                f"transaction slot {slot} is still held by unfinished batch {holders[0]}; "
                "starting another batch on it could lose that batch's transactions",
                sink=self.sink,
                batch_id=batch_id,
                fix="run `sparkeos recover <checkpointLocation>` (or restart the query, "
                "which recovers first) so the earlier batch is committed or rolled back",
            )
