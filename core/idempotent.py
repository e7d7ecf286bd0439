"""Idempotent-sink helpers: stable row keys, so a replayed write overwrites itself.

Used with an upsert (``INSERT ... ON CONFLICT DO UPDATE``, a keyed Kafka topic with
compaction, a key-value store), at-least-once delivery gives exactly-once *results*.

* From user key columns: the key is a hash of their values, stable across batches,
  replays and partitioning changes. Each value is encoded as ``N`` (null) or
  ``<length>:<text>`` (its text as Spark's ``CAST(... AS STRING)`` writes it), so no
  two different rows share an encoding (a separator inside a value, or a value equal
  to some null marker, cannot make them collide).
* Without keys: ``<batch>-<partition>-<position>``, stable across a replay of the same
  batch only if the batch's partition contents and order are deterministic (e.g. the
  file or Kafka source without a shuffle, or after ``sortWithinPartitions``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
from collections.abc import Iterator, Sequence
from typing import Any

from .errors import ConfigurationError

KEY_COLUMN = "_sparkeos_key"
_NULL = "N"


def key_text(value: Any) -> str:
    """A key value as Spark's ``CAST(value AS STRING)`` writes it.

    Defined for the types whose text Python and Spark agree on: strings, booleans,
    integers, dates and decimals. Floats, timestamps and binary values have other
    text forms in Spark (``1.0E20``, the session time zone, UTF-8 decoding): compute
    their keys in Spark with ``with_stable_keys``."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dt.datetime):
        raise TypeError("timestamps: compute the key in Spark (with_stable_keys)")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    raise TypeError(f"key_of does not encode {type(value).__name__} values like Spark "
                    "does; compute the key in Spark (with_stable_keys)")


def _encode(text: str | None) -> str:
    return _NULL if text is None else f"{len(text)}:{text}"


def key_of(values: Sequence[Any]) -> str:
    """The stable key of one row's key values: the key ``with_stable_keys`` computes
    in Spark for the same values (for the types ``key_text`` accepts)."""
    encoded = "".join(_encode(None if v is None else key_text(v)) for v in values)
    return hashlib.sha256(encoded.encode()).hexdigest()


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
        parts = []
        for c in key_columns:
            text = F.col(c).cast("string")
            parts.append(F.when(text.isNull(), F.lit(_NULL)).otherwise(
                F.concat(F.length(text).cast("string"), F.lit(":"), text)))
        return df.withColumn(column, F.sha2(F.concat(*parts), 256))
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
