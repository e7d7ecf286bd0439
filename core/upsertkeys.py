"""The rule every upserting sink applies to its keys: one row per key in a batch.

A key twice in one batch has no single new value: it is refused, as a MERGE refuses
several source rows matching one target row. Upserting sinks cluster each batch by the
key (``TransactionalSink.cluster_by``), so a key's rows meet in one participant, where
the attempt sees the repeat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from .errors import ConfigurationError, DataRejectedError
from .protocol import Transaction


def check_key(key: Sequence[str], schema: pa.Schema) -> None:
    """Refuse, before any batch, a key the stream lacks, or one of structs, lists or
    maps: its values cannot be told apart by hashing them."""
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


__all__ = ["check_key", "refuse_repeated_keys"]
