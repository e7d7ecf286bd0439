"""A Parquet file's footer, read and written: the Thrift compact protocol of its
``FileMetaData`` (parquet-format's ``parquet.thrift``), kept as the fields it holds.

pyarrow writes the pages of a part file; its footer then gets the schema and key-value
metadata Spark's writer gives the same data (``parquet.py``). A footer is decoded
into plain values, without a model of every struct: a struct is the list of its
fields ``(id, type, value)``, so fields this module does not know (statistics, page
indexes, the ones later versions of the format add) are written back as they were.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

MAGIC = b"PAR1"

# Thrift compact protocol types.
BOOL_TRUE, BOOL_FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)
BOOL = BOOL_TRUE
"""How this module records a boolean field's type (its value says which)."""


@dataclass
class Field:
    """One field of a Thrift struct."""

    id: int
    type: int
    value: Any


@dataclass
class ThriftList:
    """A Thrift list (or set): its element type and elements."""

    type: int
    items: list[Any]


Struct = list[Field]


def get(fields: Struct, field_id: int) -> Any:
    """The value of field ``field_id``, None if the struct has none."""
    for item in fields:
        if item.id == field_id:
            return item.value
    return None


def put(fields: Struct, field_id: int, kind: int, value: Any) -> None:
    """Set field ``field_id`` (replaced, or inserted in field order)."""
    for index, item in enumerate(fields):
        if item.id == field_id:
            fields[index] = Field(field_id, kind, value)
            return
        if item.id > field_id:
            fields.insert(index, Field(field_id, kind, value))
            return
    fields.append(Field(field_id, kind, value))


# -- reading -----------------------------------------------------------------------------
class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        value = self.data[self.pos]
        self.pos += 1
        return value

    def varint(self) -> int:
        shift = result = 0
        while True:
            byte = self.byte()
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def zigzag(self) -> int:
        value = self.varint()
        return (value >> 1) ^ -(value & 1)

    def value(self, kind: int) -> Any:
        if kind in (BOOL_TRUE, BOOL_FALSE):  # an element of a list: one byte
            return self.byte() == BOOL_TRUE
        if kind == BYTE:
            return struct.unpack("<b", bytes([self.byte()]))[0]
        if kind in (I16, I32, I64):
            return self.zigzag()
        if kind == DOUBLE:
            self.pos += 8
            return struct.unpack("<d", self.data[self.pos - 8:self.pos])[0]
        if kind == BINARY:
            size = self.varint()
            self.pos += size
            return self.data[self.pos - size:self.pos]
        if kind in (LIST, SET):
            header = self.byte()
            size, element = header >> 4, header & 0x0F
            if size == 15:
                size = self.varint()
            return ThriftList(element, [self.value(element) for _ in range(size)])
        if kind == MAP:
            size = self.varint()
            types = self.byte() if size else 0
            return (types >> 4, types & 0x0F,
                    [(self.value(types >> 4), self.value(types & 0x0F)) for _ in range(size)])
        if kind == STRUCT:
            return self.struct()
        raise ValueError(f"not a Thrift compact type: {kind}")

    def struct(self) -> Struct:
        fields: Struct = []
        last = 0
        while True:
            header = self.byte()
            if header == 0:
                return fields
            delta, kind = header >> 4, header & 0x0F
            field_id = last + delta if delta else self.zigzag()
            last = field_id
            if kind in (BOOL_TRUE, BOOL_FALSE):
                fields.append(Field(field_id, BOOL, kind == BOOL_TRUE))
            else:
                fields.append(Field(field_id, kind, self.value(kind)))


def decode(data: bytes) -> Struct:
    """A Thrift struct from its compact encoding."""
    return _Reader(data).struct()


# -- writing -----------------------------------------------------------------------------
def _varint(value: int, out: bytearray) -> None:
    while True:
        if value < 0x80:
            out.append(value)
            return
        out.append((value & 0x7F) | 0x80)
        value >>= 7


def _zigzag(value: int, out: bytearray) -> None:
    _varint((value << 1) ^ (value >> 63), out)


def _value(kind: int, value: Any, out: bytearray) -> None:
    if kind in (BOOL_TRUE, BOOL_FALSE):
        out.append(BOOL_TRUE if value else BOOL_FALSE)
    elif kind == BYTE:
        out += struct.pack("<b", value)
    elif kind in (I16, I32, I64):
        _zigzag(value, out)
    elif kind == DOUBLE:
        out += struct.pack("<d", value)
    elif kind == BINARY:
        _varint(len(value), out)
        out += value
    elif kind in (LIST, SET):
        items = value.items
        if len(items) < 15:
            out.append(len(items) << 4 | value.type)
        else:
            out.append(0xF0 | value.type)
            _varint(len(items), out)
        for item in items:
            _value(value.type, item, out)
    elif kind == MAP:
        key_type, value_type, pairs = value
        _varint(len(pairs), out)
        if pairs:
            out.append(key_type << 4 | value_type)
        for key, item in pairs:
            _value(key_type, key, out)
            _value(value_type, item, out)
    elif kind == STRUCT:
        _struct(value, out)
    else:
        raise ValueError(f"not a Thrift compact type: {kind}")


def _struct(fields: Struct, out: bytearray) -> None:
    last = 0
    for item in fields:
        kind = item.type
        if kind in (BOOL_TRUE, BOOL_FALSE):
            kind = BOOL_TRUE if item.value else BOOL_FALSE
        delta = item.id - last
        if 0 < delta <= 15:
            out.append(delta << 4 | kind)
        else:
            out.append(kind)
            _zigzag(item.id, out)
        last = item.id
        if kind not in (BOOL_TRUE, BOOL_FALSE):
            _value(kind, item.value, out)
    out.append(0)


def encode(fields: Struct) -> bytes:
    """The compact encoding of a Thrift struct."""
    out = bytearray()
    _struct(fields, out)
    return bytes(out)


# -- a file's footer ---------------------------------------------------------------------
def read_footer(path: str) -> tuple[Struct, int]:
    """The ``FileMetaData`` of the Parquet file at ``path`` and where it starts."""
    with open(path, "rb") as handle:
        handle.seek(-8, os.SEEK_END)
        tail = handle.read(8)
        if tail[4:] != MAGIC:
            raise ValueError(f"{path} is not a Parquet file (it does not end in PAR1)")
        size = struct.unpack("<i", tail[:4])[0]
        start = handle.tell() - 8 - size
        handle.seek(start)
        return decode(handle.read(size)), start


def replace_footer(path: str, metadata: Struct, start: int) -> None:
    """Write ``metadata`` as the footer of the file at ``path``, in place of the one
    that starts at ``start`` (the pages before it are kept)."""
    footer = encode(metadata)
    with open(path, "r+b") as handle:
        handle.seek(start)
        handle.write(footer + struct.pack("<i", len(footer)) + MAGIC)
        handle.truncate()


__all__ = ["BINARY", "BOOL", "BYTE", "I16", "I32", "I64", "LIST", "STRUCT", "Field",
           "Struct", "ThriftList", "decode", "encode", "get", "put", "read_footer",
           "replace_footer"]
