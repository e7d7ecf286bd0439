"""Spark's Parquet schema for a Spark schema, as Spark's writer makes it
(``SparkToParquetSchemaConverter``, Spark 4.3), and the text of Spark's schema that it
stores in the footer (``org.apache.spark.sql.parquet.row.metadata``).

The schema is a list of parquet-format ``SchemaElement`` structs, in the footer's order
(depth first), ready for ``parquet_footer``. Each leaf also gets its physical type and
its definition and repetition levels, so that the pages pyarrow wrote for the same
columns can be checked to fit it before its footer gets this schema.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sparkeos.core.errors import ConfigurationError

from .parquet_footer import BINARY, BOOL, BYTE, I32, STRUCT, Field, Struct

ROOT_NAME = "spark_schema"
FIELD_ID_KEY = "parquet.field.id"
"""A Spark field's metadata key for its Parquet field ID."""

# parquet.thrift's enums.
BOOLEAN, INT32, INT64, INT96, FLOAT, DOUBLE, BYTE_ARRAY, FIXED_LEN_BYTE_ARRAY = range(8)
REQUIRED, OPTIONAL, REPEATED = range(3)
UTF8, MAP, MAP_KEY_VALUE, LIST = 0, 1, 2, 3
DECIMAL, DATE, TIMESTAMP_MILLIS, TIMESTAMP_MICROS, INT_8, INT_16 = 5, 6, 9, 10, 15, 16
# LogicalType's union members, and TimeUnit's.
_STRING, _MAP, _LIST, _DECIMAL, _DATE, _TIMESTAMP, _INTEGER = 1, 2, 3, 5, 6, 8, 10
_MILLIS, _MICROS = 1, 2

INT96_TIMESTAMPS, MICROS_TIMESTAMPS, MILLIS_TIMESTAMPS = "INT96", "TIMESTAMP_MICROS", \
    "TIMESTAMP_MILLIS"


@dataclass(frozen=True)
class Leaf:
    """A column of the file: what its pages must hold."""

    path: tuple[str, ...]
    physical: int
    length: int
    max_definition: int
    max_repetition: int


@dataclass
class _Node:
    name: str
    repetition: int | None
    physical: int | None = None
    length: int = 0
    converted: int | None = None
    logical: Struct | None = None
    decimal: tuple[int, int] | None = None
    """(scale, precision)."""
    field_id: int | None = None
    children: list[_Node] = field(default_factory=list)

    def element(self) -> Struct:
        fields: Struct = []
        if self.physical is not None:
            fields.append(Field(1, I32, self.physical))
        if self.length:
            fields.append(Field(2, I32, self.length))
        if self.repetition is not None:
            fields.append(Field(3, I32, self.repetition))
        fields.append(Field(4, BINARY, self.name.encode()))
        if self.physical is None:
            fields.append(Field(5, I32, len(self.children)))
        if self.converted is not None:
            fields.append(Field(6, I32, self.converted))
        if self.decimal is not None:
            fields += [Field(7, I32, self.decimal[0]), Field(8, I32, self.decimal[1])]
        if self.field_id is not None:
            fields.append(Field(9, I32, self.field_id))
        if self.logical is not None:
            fields.append(Field(10, STRUCT, self.logical))
        return fields


def _logical(member: int, fields: Struct | None = None) -> Struct:
    return [Field(member, STRUCT, fields or [])]


def _timestamp(adjusted: bool, unit: int) -> Struct:
    return _logical(_TIMESTAMP, [Field(1, BOOL, adjusted),
                                 Field(2, STRUCT, [Field(unit, STRUCT, [])])])


@dataclass(frozen=True)
class SparkParquetSchema:
    """The Parquet schema Spark writes for a Spark schema under the given settings."""

    elements: list[Struct]
    leaves: list[Leaf]


def parquet_schema(schema: Any, timestamps: str, legacy: bool,
                   field_ids: bool) -> SparkParquetSchema:
    """The Parquet schema of Spark's writer for the Spark ``StructType`` ``schema``, with
    ``spark.sql.parquet.outputTimestampType`` = ``timestamps``, ``writeLegacyFormat`` =
    ``legacy`` and ``fieldId.write.enabled`` = ``field_ids``."""
    converter = _Converter(timestamps, legacy, field_ids)
    root = _Node(ROOT_NAME, None, children=[converter.field(f) for f in schema.fields])
    elements: list[Struct] = []
    leaves: list[Leaf] = []
    _flatten(root, (), 0, 0, elements, leaves, top=True)
    return SparkParquetSchema(elements, leaves)


def _flatten(node: _Node, path: tuple[str, ...], definition: int, repetition: int,
             elements: list[Struct], leaves: list[Leaf], top: bool = False) -> None:
    elements.append(node.element())
    if not top:
        path = (*path, node.name)
        definition += node.repetition != REQUIRED
        repetition += node.repetition == REPEATED
    if node.physical is not None:
        leaves.append(Leaf(path, node.physical, node.length, definition, repetition))
    for child in node.children:
        _flatten(child, path, definition, repetition, elements, leaves)


class _Converter:
    def __init__(self, timestamps: str, legacy: bool, field_ids: bool) -> None:
        self.timestamps, self.legacy, self.field_ids = timestamps, legacy, field_ids

    def field(self, spark_field: Any) -> _Node:
        node = self.node(spark_field.name, spark_field.dataType,
                         OPTIONAL if spark_field.nullable else REQUIRED)
        metadata = spark_field.metadata or {}
        if self.field_ids and FIELD_ID_KEY in metadata:
            node.field_id = int(metadata[FIELD_ID_KEY])
        return node

    def node(self, name: str, kind: Any, repetition: int) -> _Node:
        from pyspark.sql import types as t

        if isinstance(kind, t.BooleanType):
            return _Node(name, repetition, BOOLEAN)
        if isinstance(kind, (t.ByteType, t.ShortType)):
            width = 8 if isinstance(kind, t.ByteType) else 16
            return _Node(name, repetition, INT32, converted=INT_8 if width == 8 else INT_16,
                         logical=_logical(_INTEGER, [Field(1, BYTE, width),
                                                     Field(2, BOOL, True)]))
        if isinstance(kind, (t.IntegerType, t.YearMonthIntervalType)):
            return _Node(name, repetition, INT32)
        if isinstance(kind, (t.LongType, t.DayTimeIntervalType)):
            return _Node(name, repetition, INT64)
        if isinstance(kind, t.FloatType):
            return _Node(name, repetition, FLOAT)
        if isinstance(kind, t.DoubleType):
            return _Node(name, repetition, DOUBLE)
        if isinstance(kind, (t.StringType, t.CharType, t.VarcharType)):
            return _Node(name, repetition, BYTE_ARRAY, converted=UTF8,
                         logical=_logical(_STRING))
        if isinstance(kind, t.BinaryType):
            return _Node(name, repetition, BYTE_ARRAY)
        if isinstance(kind, t.DateType):
            return _Node(name, repetition, INT32, converted=DATE, logical=_logical(_DATE))
        if isinstance(kind, t.TimestampNTZType):
            return _Node(name, repetition, INT64, converted=TIMESTAMP_MICROS,
                         logical=_timestamp(False, _MICROS))
        if isinstance(kind, t.TimestampType):
            if self.timestamps == INT96_TIMESTAMPS:
                return _Node(name, repetition, INT96)
            millis = self.timestamps == MILLIS_TIMESTAMPS
            return _Node(name, repetition, INT64,
                         converted=TIMESTAMP_MILLIS if millis else TIMESTAMP_MICROS,
                         logical=_timestamp(True, _MILLIS if millis else _MICROS))
        if isinstance(kind, t.DecimalType):
            return self.decimal(name, kind.precision, kind.scale, repetition)
        if isinstance(kind, t.ArrayType):
            return self.array(name, kind, repetition)
        if isinstance(kind, t.MapType):
            entries = _Node("key_value", REPEATED, children=[
                self.node("key", kind.keyType, REQUIRED),
                self.node("value", kind.valueType,
                          OPTIONAL if kind.valueContainsNull else REQUIRED)])
            if self.legacy:
                entries.converted = MAP_KEY_VALUE
            return _Node(name, repetition, converted=MAP, logical=_logical(_MAP),
                         children=[entries])
        if isinstance(kind, t.StructType) and kind.fields:
            return _Node(name, repetition, children=[self.field(f) for f in kind.fields])
        if isinstance(kind, t.UserDefinedType):
            return self.node(name, kind.sqlType(), repetition)
        raise ConfigurationError(
            f"column {name!r} is of type {kind.simpleString()}, which sparkeos cannot write "
            "to Parquet as Spark writes it (Spark shreds a variant by its values; it "
            "refuses void and empty structs)",
            fix=f"cast or convert the column before the sink (to_json({name}) for a "
            "variant), or write it with Spark's own parquet sink; nothing was written")

    def decimal(self, name: str, precision: int, scale: int, repetition: int) -> _Node:
        node = _Node(name, repetition, FIXED_LEN_BYTE_ARRAY, converted=DECIMAL,
                     decimal=(scale, precision),
                     logical=_logical(_DECIMAL, [Field(1, I32, scale),
                                                 Field(2, I32, precision)]))
        if self.legacy or precision > 18:
            node.length = min_bytes_for_precision(precision)
        else:
            node.physical = INT32 if precision <= 9 else INT64
        return node

    def array(self, name: str, kind: Any, repetition: int) -> _Node:
        if not self.legacy:
            element = self.node("element", kind.elementType,
                                OPTIONAL if kind.containsNull else REQUIRED)
            middle = _Node("list", REPEATED, children=[element])
        elif kind.containsNull:  # Spark 1.4's three levels: parquet-hive's, avro's name
            middle = _Node("bag", REPEATED,
                           children=[self.node("array", kind.elementType, OPTIONAL)])
        else:  # and its two levels for elements that are never null
            middle = self.node("array", kind.elementType, REPEATED)
        return _Node(name, repetition, converted=LIST, logical=_logical(_LIST),
                     children=[middle])


def min_bytes_for_precision(precision: int) -> int:
    """Spark's ``Decimal.minBytesForPrecision``: the fewest bytes whose two's complement
    holds every unscaled value of ``precision`` digits."""
    size = 1
    while math.pow(2.0, 8 * size - 1) < math.pow(10.0, precision):
        size += 1
    return size


def file_leaves(elements: list[Struct]) -> list[Leaf]:
    """The leaves of a footer's schema (as a writer wrote it)."""
    leaves: list[Leaf] = []

    def walk(index: int, path: tuple[str, ...], definition: int, repetition: int,
             top: bool) -> int:
        element = {f.id: f.value for f in elements[index]}
        if not top:
            path = (*path, element[4].decode())
            kind = element.get(3, OPTIONAL)
            definition += kind != REQUIRED
            repetition += kind == REPEATED
        index += 1
        if 1 in element and not top:
            leaves.append(Leaf(path, element[1], element.get(2, 0) if element[1] ==
                               FIXED_LEN_BYTE_ARRAY else 0, definition, repetition))
            return index
        for _ in range(element.get(5, 0)):
            index = walk(index, path, definition, repetition, False)
        return index

    walk(0, (), 0, 0, True)
    return leaves


# -- Spark's text of a schema -------------------------------------------------------------
def schema_text(schema: Any) -> str:
    """``schema`` (a ``StructType``) as Spark's ``StructType.json`` writes it: the keys in
    Spark's order (pyspark's ``json()`` sorts them), non-ASCII text as is, control
    characters escaped as Jackson escapes them and numbers in field metadata as Java
    writes a double."""
    return _render(schema.jsonValue())


def _render(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(f"{_string(str(k))}:{_render(v)}"
                              for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_render(v) for v in value) + "]"
    if isinstance(value, str):
        return _string(value)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float):
        return java_double(value)
    return str(int(value))


_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\f": "\\f",
                  "\n": "\\n", "\r": "\\r"}


def _string(text: str) -> str:
    out = ['"']
    for ch in text:
        escaped = _SHORT_ESCAPES.get(ch)
        if escaped is not None:
            out.append(escaped)
        elif ch < " ":
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def java_double(value: float) -> str:
    """Java's ``Double.toString`` of ``value`` (the shortest digits that read back the
    same, as Java 19 and later choose them)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    text = "".join(map(str, digits))
    point = len(text) + int(exponent)  # digits before the decimal point
    minus = "-" if sign else ""
    if 1e-3 <= abs(value) < 1e7:
        if point <= 0:
            return f"{minus}0.{'0' * -point}{text}"
        whole, fraction = text[:point].ljust(point, "0"), text[point:]
        return f"{minus}{whole}.{fraction or '0'}"
    return f"{minus}{text[0]}.{text[1:] or '0'}E{point - 1}"


__all__ = ["ROOT_NAME", "Leaf", "SparkParquetSchema", "file_leaves", "java_double",
           "min_bytes_for_precision", "parquet_schema", "schema_text"]
