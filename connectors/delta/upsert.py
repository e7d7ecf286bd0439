"""Upserts into a Delta table (``DeltaSink(key=...)``, for update-mode aggregations):
phase 1 stages each attempt's rows whole under ``<table>/_sparkeos/staging/<txn id>/``
(outside the table: Delta ignores ``_`` names), and phase 2 MERGEs the batch's staged
rows into the table by the key in one commit, with the batch's ``SetTransaction``
(``table.merge_batch``). Applying a batch twice would be harmless for its own keys, but
applied after a later batch it would bring back older values: the app version keeps
each batch to one MERGE, in batch order."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from sparkeos.core.errors import DataRejectedError
from sparkeos.core.protocol import Transaction

from .files import SPARKEOS_DIR


def staged_prefix(txn: Transaction) -> str:
    return f"{SPARKEOS_DIR}/staging/{txn.txn_id}/"


def staged_path(txn: Transaction, number: int) -> str:
    return f"{staged_prefix(txn)}part-{number:05d}.parquet"


def refuse_repeated_keys(seen: set[tuple[object, ...]], batch: pa.RecordBatch,
                         key: Sequence[str], txn: Transaction) -> None:
    """A key twice in one batch has no single new value: refused, as MERGE refuses
    several source rows matching one target row (the batch is clustered by the key, so
    its repeats meet in one participant)."""
    for row in zip(*(batch.column(k).to_pylist() for k in key), strict=True):
        if row in seen:
            raise DataRejectedError(
                f"key {dict(zip(key, row, strict=True))} appears twice in batch "
                f"{txn.batch_id}: an upsert needs one row per key", sink=txn.sink,
                batch_id=txn.batch_id,
                fix="aggregate or deduplicate by the key before the sink "
                "(dropDuplicates, or the aggregation's own key); nothing was written")
        seen.add(row)


def merge_predicate(key: Sequence[str]) -> str:
    # A null key matches a null key (an aggregation's group may be null).
    return " AND ".join(f"t.`{k}` IS NOT DISTINCT FROM s.`{k}`" for k in key)


__all__ = ["merge_predicate", "refuse_repeated_keys", "staged_path", "staged_prefix"]
