"""Turn Arrow batches of a foreachBatch DataFrame into messages (Kafka records, STOMP
frames): shared by the message-broker connectors.

A :class:`RecordLayout` describes which columns hold the topic (a STOMP destination),
key, value (body) and headers and how keys and values are encoded.
``serialize(batch)`` returns a *record batch* with the columns ``key`` (binary),
``value`` (binary) and, when configured, ``topic`` (string) and ``headers`` (list of
(string, binary) structs). That record batch is what staged mode writes to disk and
what both modes produce from, so the bytes published in phase 2 are exactly the
bytes prepared in phase 1.

Formats (``key_format`` / ``value_format``):

``bytes``
    binary columns as they are; string columns as UTF-8.
``string``
    any column cast to string by Arrow, then UTF-8.
``json``
    each value JSON-encoded as Spark's ``to_json`` writes it (``core/text/sparkjson.py``;
    ``null`` stays a Kafka null, not the text ``null``).
``None`` (auto)
    ``bytes`` for binary and string columns, ``json`` for everything else.

Without ``value_column`` the value is the whole row as a JSON object (every column
except the topic and headers columns), as Spark's ``to_json(struct(*))`` writes it:
``{"id":7,"payload":"row-7"}``, null fields left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkeos.core.errors import ConfigurationError, SchemaMismatchError

from .sparkjson import json_objects, json_values

FORMATS = ("bytes", "string", "json")
HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

Record = tuple[str | None, bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]
"""(topic or None for the default topic, value, key, headers or None)."""


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or getattr(pa.types, "is_string_view", lambda _: False)(t))


def _is_binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t)
                or pa.types.is_fixed_size_binary(t)
                or getattr(pa.types, "is_binary_view", lambda _: False)(t))


def check_format(name: str, value: str | None) -> None:
    if value is not None and value not in FORMATS:
        raise ConfigurationError(
            f"unknown {name} {value!r}",
            fix=f"use one of: {', '.join(FORMATS)} (or leave it unset for auto)",
        )


def check_payload_format(payload: str, column: str | None, fmt: str | None) -> None:
    """``<payload>_format`` is known, and names a format for ``<payload>_column``: without
    the column the payload is the whole row as JSON, the only format it can have."""
    check_format(f"{payload}_format", fmt)
    if column is None and fmt not in (None, "json"):
        raise ConfigurationError(
            f"{payload}_format={fmt!r} needs a {payload}_column; without one the "
            f"{payload} is the whole row as JSON",
            fix=f"set {payload}_column='<column>' or drop {payload}_format",
        )


@dataclass(frozen=True)
class RecordLayout:
    topic: str | None
    topic_column: str | None
    key_column: str | None
    value_column: str | None
    headers_column: str | None
    key_format: str | None
    value_format: str | None
    target: str = "topic"
    """What the connector calls a topic (error messages say ``<target>_column``)."""
    owner: str = "KafkaSink"
    """The sink class error messages name."""

    # -- schema checks (driver) -----------------------------------------------------------
    def check_schema(self, schema: pa.Schema) -> None:
        names = set(schema.names)
        roles = ((f"{self.target}_column", self.topic_column), ("key_column", self.key_column),
                 ("value_column", self.value_column), ("headers_column", self.headers_column))
        for role, column in roles:
            if column is not None and column not in names:
                raise SchemaMismatchError(
                    f"{role}={column!r} is not a column of the batch (columns: "
                    f"{', '.join(schema.names)})",
                    fix=f"add the column to the DataFrame or change {role}; nothing of "
                    "this batch was written",
                )
        if self.topic_column is not None:
            t = schema.field(self.topic_column).type
            if not _is_text(t):
                raise SchemaMismatchError(
                    f"{self.target}_column {self.topic_column!r} has type {t}; it must be a "
                    "string",
                    fix=f"cast it: df.withColumn({self.topic_column!r}, "
                    f"col({self.topic_column!r}).cast('string'))",
                )
        for role, column, fmt in (("key", self.key_column, self.key_format),
                                  ("value", self.value_column, self.value_format)):
            if column is None:
                continue
            t = schema.field(column).type
            if fmt == "bytes" and not (_is_binary(t) or _is_text(t)):
                raise SchemaMismatchError(
                    f"{role}_column {column!r} has type {t}; {role}_format='bytes' needs a "
                    "binary or string column",
                    fix=f"cast the column to binary/string, or use {role}_format='string' "
                    "or 'json'",
                )
            if fmt == "string" and not pc_can_cast_to_string(t):
                raise SchemaMismatchError(
                    f"{role}_column {column!r} has type {t}, which has no string form",
                    fix=f"use {role}_format='json'",
                )
        if self.headers_column is not None:
            t = schema.field(self.headers_column).type
            if not _headers_type_ok(t):
                raise SchemaMismatchError(
                    f"headers_column {self.headers_column!r} has type {t}",
                    fix="use array<struct<key: string, value: binary or string>> (as Spark's "
                    "Kafka sink) or map<string, binary or string>",
                )

    def staged_schema(self) -> pa.Schema:
        fields = []
        if self.topic_column is not None:
            fields.append(pa.field("topic", pa.string()))
        fields += [pa.field("key", pa.binary()), pa.field("value", pa.binary())]
        if self.headers_column is not None:
            fields.append(pa.field("headers", HEADER_TYPE))
        return pa.schema(fields)

    # -- serialisation (tasks) ---------------------------------------------------------------
    def serialize(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        columns: list[pa.Array] = []
        if self.topic_column is not None:
            topics = batch.column(self.topic_column).cast(pa.string())
            if self.topic is not None and topics.null_count:
                topics = pc.fill_null(topics, self.topic)
            elif topics.null_count:
                raise SchemaMismatchError(
                    f"{self.target}_column {self.topic_column!r} is null in "
                    f"{topics.null_count} rows and no default {self.target} is set",
                    fix=f"fill the column, or give {self.owner}({self.target}=...) as the "
                    "default",
                )
            columns.append(topics)
        if self.key_column is None:
            columns.append(pa.nulls(n, pa.binary()))
        else:
            columns.append(_encode(batch.column(self.key_column), self.key_format))
        if self.value_column is None:
            columns.append(self._row_json(batch))
        else:
            columns.append(_encode(batch.column(self.value_column), self.value_format))
        if self.headers_column is not None:
            columns.append(_headers(batch.column(self.headers_column)))
        return pa.RecordBatch.from_arrays(columns, schema=self.staged_schema())

    def _row_json(self, batch: pa.RecordBatch) -> pa.Array:
        skip = {self.topic_column, self.headers_column}
        names = [name for name in batch.schema.names if name not in skip]
        return json_objects(batch.select(names)).cast(pa.binary())


def pc_can_cast_to_string(t: pa.DataType) -> bool:
    if _is_text(t) or _is_binary(t):
        return True
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                or pa.types.is_decimal(t) or pa.types.is_temporal(t))


def _headers_type_ok(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return _is_text(t.key_type) and (_is_binary(t.item_type) or _is_text(t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = t.value_type
        if pa.types.is_struct(item) and item.num_fields == 2:
            k = item.field(0).type
            v = item.field(1).type
            return _is_text(k) and (_is_binary(v) or _is_text(v))
    return False


def _encode(column: pa.Array | pa.ChunkedArray, fmt: str | None) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    t = column.type
    if fmt is None:
        fmt = "bytes" if (_is_binary(t) or _is_text(t)) else "json"
    if fmt == "bytes":
        if pa.types.is_fixed_size_binary(t) or _is_text(t) or not pa.types.is_binary(t):
            return column.cast(pa.binary())
        return column
    if fmt == "string":
        if not _is_text(t):
            column = column.cast(pa.string())
        return column.cast(pa.binary())
    return json_values(column).cast(pa.binary())


def _headers(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    rows = column.to_pylist()
    out: list[list[dict[str, Any]] | None] = []
    for row in rows:
        if row is None:
            out.append(None)
            continue
        pairs = row if isinstance(row, list) else list(row.items())
        items = []
        for pair in pairs:
            if isinstance(pair, dict):
                k, v = pair.get("key"), pair.get("value")
            else:
                k, v = pair
            if isinstance(v, str):
                v = v.encode()
            items.append({"key": k, "value": v})
        out.append(items)
    return pa.array(out, HEADER_TYPE)


def iter_records(staged: pa.RecordBatch) -> Iterator[Record]:
    """The (topic, value, key, headers) tuples of one serialized record batch."""
    n = staged.num_rows
    names = staged.schema.names
    values = staged.column(names.index("value")).to_pylist()
    key_col = staged.column(names.index("key"))
    keys: list[Any] = [None] * n if key_col.null_count == n else key_col.to_pylist()
    topics: list[Any] = (staged.column(names.index("topic")).to_pylist()
                         if "topic" in names else [None] * n)
    if "headers" in names:
        headers: list[Any] = [
            None if h is None else [(item["key"], item["value"]) for item in h]
            for h in staged.column(names.index("headers")).to_pylist()
        ]
    else:
        headers = [None] * n
    return zip(topics, values, keys, headers, strict=True)
