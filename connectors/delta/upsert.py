"""Upserts into a Delta table (``DeltaSink(key=...)``, for update-mode aggregations):
phase 1 stages each attempt's rows whole under ``<table>/_sparkeos/staging/<txn id>/``
(outside the table: Delta ignores ``_`` names), and phase 2 MERGEs the batch's staged
rows into the table by the key in one commit, with the batch's ``SetTransaction``
(``table.merge_batch``). Applying a batch twice would be harmless for its own keys, but
applied after a later batch it would bring back older values: the app version keeps
each batch to one MERGE, in batch order."""

from __future__ import annotations

from collections.abc import Sequence

from sparkeos.core.protocol import Transaction

from .files import SPARKEOS_DIR


def staged_prefix(txn: Transaction) -> str:
    return f"{SPARKEOS_DIR}/staging/{txn.txn_id}/"


def staged_path(txn: Transaction, number: int) -> str:
    return f"{staged_prefix(txn)}part-{number:05d}.parquet"


def merge_predicate(key: Sequence[str]) -> str:
    # A null key matches a null key (an aggregation's group may be null).
    return " AND ".join(f"t.`{k}` IS NOT DISTINCT FROM s.`{k}`" for k in key)


__all__ = ["merge_predicate", "staged_path", "staged_prefix"]
