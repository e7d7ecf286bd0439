"""Upserts into an Iceberg table (``IcebergSink(key=...)``, for update-mode
aggregations): phase 1 stages each attempt's rows whole, in the table's types, under
``<table>/_sparkeos/staging/<txn id>/`` (no snapshot references them), listed in the
attempt's manifest like data files; phase 2 deletes the table's rows with the batch's
keys and adds the batch's rows in one metadata commit with the batch's property
(``table.merge_batch``). Applying a batch twice would be harmless for its own keys, but
applied after a later batch it would bring back older values: the property keeps each
batch to one merge, in batch order."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from sparkeos.core.protocol import Transaction
from sparkeos.core.storage.locations import parse as parse_location

from .files import SPARKEOS_DIR, TableStore


def staged_prefix(root: str, txn: Transaction) -> str:
    return f"{root.rstrip('/')}/{SPARKEOS_DIR}/staging/{txn.txn_id}/"


def staged_uri(root: str, txn: Transaction, number: int) -> str:
    return f"{staged_prefix(root, txn)}part-{number:05d}.parquet"


def delete_staged(store: TableStore, root: str, txn: Transaction,
                  uris: Sequence[str]) -> set[str]:
    """Delete the attempt's staged rows among ``uris`` (no snapshot references them)
    and their directory; the staged ones, returned."""
    prefix = staged_prefix(root, txn)
    staged = {uri for uri in uris if uri.startswith(prefix)}
    store.delete_files(sorted(staged))
    if parse_location(prefix).is_local:  # an object store has no directories
        with contextlib.suppress(OSError):  # already gone, or not empty (another file)
            os.rmdir(prefix)
    return staged


def staged_rows(store: TableStore, uris: Sequence[str]) -> pa.Table:
    """The batch's staged rows (at least one file), in the table's types."""
    return pa.concat_tables([pq.read_table(pa.BufferReader(store.read(uri)))
                             for uri in uris])


__all__ = ["delete_staged", "staged_prefix", "staged_rows", "staged_uri"]
