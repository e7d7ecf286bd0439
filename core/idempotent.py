"""Idempotent-sink helpers: stable row keys, so a replayed write overwrites itself.

Used with an upsert (``INSERT ... ON CONFLICT DO UPDATE``, a keyed Kafka topic with
compaction, a key-value store), at-least-once delivery gives exactly-once *results*.

* From user key columns: the key is a hash of their values, stable across batches,
  replays and partitioning changes.
* Without keys: ``<batch>-<partition>-<position>``, stable across a replay of the same
  batch only if the batch's partition contents and order are deterministic (e.g. the
  file or Kafka source without a shuffle, or after ``sortWithinPartitions``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

from .errors import ConfigurationError

KEY_COLUMN = "_sparkeos_key"
_SEPARATOR = "\x1f"
_NULL = "\x00"


def key_of(values: Sequence[Any]) -> str:
    """The stable key of one row's key values (same as ``with_stable_keys``)."""
    text = _SEPARATOR.join(_NULL if v is None else str(v) for v in values)
    return hashlib.sha256(text.encode()).hexdigest()


def positional_keys(batch_id: int, partition: int, start: int, count: int) -> Iterator[str]:
    """Keys ``<batch>-<partition>-<position>`` for rows ``start .. start+count-1``."""
    for position in range(start, start + count):
        yield f"{batch_id}-{partition}-{position}"


def with_stable_keys(df: Any, batch_id: int, key_columns: Sequence[str] | None = None,
                     column: str = KEY_COLUMN) -> Any:
    """Return ``df`` with a string column ``column`` holding a stable row key."""
    from pyspark.sql import functions as F

    if key_columns:
        missing = [c for c in key_columns if c not in df.columns]
        if missing:
            raise ConfigurationError(
                f"key columns {missing} are not in the DataFrame (columns: {df.columns})",
                batch_id=batch_id, fix="name existing columns in key_columns",
            )
        parts = [F.coalesce(F.col(c).cast("string"), F.lit(_NULL)) for c in key_columns]
        return df.withColumn(column, F.sha2(F.concat_ws(_SEPARATOR, *parts), 256))
    # monotonically_increasing_id = partition index << 33 | position in the partition.
    mono = F.monotonically_increasing_id()
    partition = F.shiftright(mono, 33)
    position = mono.bitwiseAND(F.lit((1 << 33) - 1))
    return df.withColumn(
        column,
        F.concat_ws("-", F.lit(str(batch_id)), partition.cast("string"),
                    position.cast("string")),
    )


def drop_replayed(df: Any, key_columns: Sequence[str] = (KEY_COLUMN,)) -> Any:
    """For readers of at-least-once output: keep one row per stable key."""
    return df.dropDuplicates(list(key_columns))
