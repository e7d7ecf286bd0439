"""The rule every upserting sink applies to its keys: one row per key in a batch.

A key twice in one batch has no single new value: it is refused, as a MERGE refuses
several source rows matching one target row. Upserting sinks cluster each batch by the
key (``TransactionalSink.cluster_by``), so a key's rows meet in one participant, where
the attempt sees the repeat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .errors import DataRejectedError
from .protocol import Transaction


def refuse_repeated_keys(seen: set[tuple[object, ...]], batch: Any, key: Sequence[str],
                         txn: Transaction) -> None:
    """Add the keys of ``batch`` (an Arrow batch or table) to ``seen``, the keys this
    attempt wrote so far; a key already there is refused with ``DataRejectedError``."""
    for row in zip(*(batch.column(k).to_pylist() for k in key), strict=True):
        if row in seen:
            raise DataRejectedError(
                f"key {dict(zip(key, row, strict=True))} appears twice in batch "
                f"{txn.batch_id}: an upsert needs one row per key", sink=txn.sink,
                batch_id=txn.batch_id,
                fix="aggregate or deduplicate by the key before the sink "
                "(dropDuplicates, or the aggregation's own key); nothing was written")
        seen.add(row)


__all__ = ["refuse_repeated_keys"]
