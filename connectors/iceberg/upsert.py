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

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.protocol import Transaction
from sparkeos.core.storage import attempts
from sparkeos.core.storage.locations import local_path

from .files import SPARKEOS_DIR


def staged_prefix(root: str, txn: Transaction) -> str:
    return os.path.join(root, SPARKEOS_DIR, "staging", txn.txn_id) + os.sep


def staged_uri(root: str, txn: Transaction, number: int) -> str:
    return f"{staged_prefix(root, txn)}part-{number:05d}.parquet"


def check_key(key: Sequence[str], schema: pa.Schema) -> None:
    """Refuse, before any batch, a key the stream lacks or that has no single value."""
    for column in key:
        if column not in schema.names:
            raise ConfigurationError(
                f"key column {column!r} is not a column of the batch "
                f"({', '.join(schema.names)})", fix="upsert by columns the stream has")
        if pa.types.is_nested(schema.field(column).type):
            raise ConfigurationError(
                f"key column {column!r} is a {schema.field(column).type}: an upsert key "
                "is made of plain values", fix="upsert by plain columns (flatten the "
                "struct, or key by a hash of the list)")


def delete_staged(root: str, txn: Transaction, uris: Sequence[str]) -> set[str]:
    """Delete the attempt's staged rows among ``uris`` (no snapshot references them)
    and their directory; the staged ones, returned."""
    prefix = staged_prefix(root, txn)
    staged = {uri for uri in uris if uri.startswith(prefix)}
    attempts.delete_written([local_path(uri) for uri in staged])
    with contextlib.suppress(OSError):  # already gone, or not empty (another file)
        os.rmdir(prefix)
    return staged


def staged_rows(uris: Sequence[str]) -> pa.Table:
    """The batch's staged rows (at least one file), in the table's types."""
    return pa.concat_tables([pq.read_table(local_path(uri)) for uri in uris])


__all__ = ["check_key", "delete_staged", "staged_prefix", "staged_rows", "staged_uri"]
