"""Arrow <-> PostgreSQL: column types, compatibility checks and COPY CSV payloads."""

from __future__ import annotations

import json
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import pyarrow as pa

COPY_OPTIONS = "FORMAT csv"
"""PostgreSQL's CSV: an unquoted empty field is NULL, a quoted one ("") the empty
string; pyarrow's writer quotes every string value, so a value can never be read as
NULL or as the ``\\.`` end-of-data marker."""


def pg_type(t: pa.DataType) -> str:
    """The column type ``create_table=True`` uses for an Arrow type."""
    if pa.types.is_dictionary(t):
        return pg_type(t.value_type)
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return "smallint"
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return "integer"
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "bigint"
    if pa.types.is_uint64(t):
        return "numeric(20,0)"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "real"
    if pa.types.is_float64(t):
        return "double precision"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})" if t.precision <= 1000 else "numeric"
    if pa.types.is_boolean(t):
        return "boolean"
    if _is_string(t) or pa.types.is_null(t):
        return "text"
    if _is_binary(t):
        return "bytea"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp without time zone"
    if pa.types.is_time(t):
        return "time without time zone"
    if pa.types.is_duration(t):
        return "interval"
    if _is_nested(t):
        return "jsonb"
    raise TypeError(f"no PostgreSQL column type for Arrow type {t}")


def accepts(t: pa.DataType, typname: str, category: str) -> bool:
    """Can a column of Arrow type ``t`` be written into a PostgreSQL column?

    ``typname`` / ``category`` come from ``pg_type`` (``int4`` / ``N``...). Lenient
    within a family (an int64 into an ``integer`` column is accepted; a value out of
    range fails the batch at write time); across families only what COPY can parse.
    """
    if pa.types.is_dictionary(t):
        return accepts(t.value_type, typname, category)
    if pa.types.is_null(t):
        return True  # NULLs fit anywhere
    if _is_string(t):
        # Text is parsed by the column's input function: fine for text, enums, uuid,
        # json, inet...; numbers, booleans and dates/times must arrive typed, or one
        # unparsable value fails the whole batch inside the tasks.
        return category not in ("N", "B", "D", "T")
    if pa.types.is_integer(t) or pa.types.is_decimal(t):
        return category == "N"
    if pa.types.is_floating(t):
        return typname in ("float4", "float8", "numeric")
    if pa.types.is_boolean(t):
        return category == "B"
    if pa.types.is_date(t):
        return typname in ("date", "timestamp", "timestamptz")
    if pa.types.is_timestamp(t):
        return typname in ("timestamp", "timestamptz")
    if pa.types.is_time(t):
        return typname in ("time", "timetz")
    if pa.types.is_duration(t):
        return typname == "interval"
    if _is_binary(t):
        return typname == "bytea"
    if _is_nested(t):
        return typname in ("json", "jsonb") or category == "S"
    return False


def supported(t: pa.DataType) -> bool:
    try:
        pg_type(t)
    except TypeError:
        return False
    return True


def _is_string(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t)
            or getattr(pa.types, "is_string_view", lambda _: False)(t))


def _is_binary(t: pa.DataType) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_large_binary(t)
            or pa.types.is_fixed_size_binary(t)
            or getattr(pa.types, "is_binary_view", lambda _: False)(t))


def _is_nested(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_struct(t) or pa.types.is_map(t)
            or getattr(pa.types, "is_list_view", lambda _: False)(t))


# -- COPY payload ---------------------------------------------------------------------------


def csv_payload(batch: pa.RecordBatch) -> pa.Buffer:
    """The rows of ``batch`` as PostgreSQL ``COPY ... (FORMAT csv)`` input, in column order.

    Vectorised by pyarrow's CSV writer; only bytea, interval and JSON columns are
    converted value by value.
    """
    import pyarrow.csv as pacsv

    arrays = [_copy_ready(column) for column in batch.columns]
    ready = pa.RecordBatch.from_arrays(arrays, names=[f"c{i}" for i in range(len(arrays))])
    sink = pa.BufferOutputStream()
    pacsv.write_csv(ready, sink, pacsv.WriteOptions(include_header=False,
                                                    batch_size=max(1024, batch.num_rows)))
    return sink.getvalue()


def _copy_ready(column: pa.Array) -> pa.Array:
    t = column.type
    if pa.types.is_dictionary(t):
        return _copy_ready(column.dictionary_decode())
    if pa.types.is_float16(t):
        return column.cast(pa.float32())
    if _is_string(t) and not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return column.cast(pa.string())  # string_view
    if _is_binary(t):
        return pa.array([None if v is None else "\\x" + v.hex() for v in column.to_pylist()],
                        pa.string())
    if pa.types.is_duration(t):
        unit = {"s": "seconds", "ms": "milliseconds", "us": "microseconds",
                "ns": "microseconds"}[t.unit]
        div = 1000 if t.unit == "ns" else 1
        ints = column.cast(pa.int64()).to_pylist()
        return pa.array([None if v is None else f"{v // div} {unit}" for v in ints], pa.string())
    if _is_nested(t):
        values = column.to_pylist()
        return pa.array([None if v is None else json.dumps(_jsonable(v, t), default=_default,
                                                            ensure_ascii=False)
                         for v in values], pa.string())
    if pa.types.is_null(t):
        return pa.array([None] * len(column), pa.string())
    return column


def _jsonable(value: Any, t: pa.DataType) -> Any:
    if value is None:
        return None
    if pa.types.is_map(t):
        return {str(k): _jsonable(v, t.item_type) for k, v in value}
    if pa.types.is_struct(t):
        return {t.field(i).name: _jsonable(value.get(t.field(i).name), t.field(i).type)
                for i in range(t.num_fields)}
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or getattr(pa.types, "is_list_view", lambda _: False)(t)):
        return [_jsonable(v, t.value_type) for v in value]
    return value


def _default(value: Any) -> Any:
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray)):
        return "\\x" + bytes(value).hex()
    return str(value)
