"""JSON text of Arrow data as Spark's own JSON writer (``df.write.json``, ``to_json``)
writes it, column at a time in Arrow's kernels: no per-row Python path, no pandas
conversion.

Spark writes through Jackson with its default options, and so does this module (the
text of each value comes from ``core/text/sparktext.py``, which decides Spark's text for
every route):

* a row is one object; a null field is left out (``ignoreNullFields``), at every level
  of nesting; array elements and map values that are null are written as ``null``;
* integers and decimals in full (a decimal as Java's ``BigDecimal.toString``: plain,
  or ``1.2345E-8`` / ``0E-18`` when its exponent is below -6);
* floating point as Java's ``Double.toString`` / ``Float.toString`` (``1.0``,
  ``1.0E20``, ``1.0E-4``), NaN and infinities as the strings ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"``. The digits are the shortest that read back as the
  same value (Java 19+); Java 17's ``Double.toString`` prints a longer form for a few
  values, which reads back the same;
* strings with Jackson's escapes (``\\"``, ``\\\\``, ``\\n``... and ``\\u00XX`` for the
  other control characters; everything else as UTF-8);
* binary as base64; dates as ``yyyy-MM-dd``; timestamps as
  ``yyyy-MM-dd'T'HH:mm:ss[.SSS][XXXXX]`` in the session time zone (the zone the batch's
  Arrow type carries; ``Z`` for UTC, an offset's seconds where it has them, as a local
  mean time does: ``-07:52:58``); timestamps without a time zone as
  ``yyyy-MM-dd'T'HH:mm:ss.SSS``; years below 0 or above 9999 with their sign, as Java;
* maps as objects, each key as the ``toString`` of Spark's internal value: a date key
  as its day number, a timestamp key as its microseconds. Binary, array and struct keys
  are refused (``ConfigurationError``): Spark writes a JVM object's identity for them.

Types Spark's JSON writer has no Arrow form for here (durations, times) are written
as quoted text of their Python values.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .sparktext import date_text, decimal_text, double_text, json_timestamp_text, map_key_text

_JACKSON_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_CONTROL = "[\x00-\x1f]"
_ESCAPED = '[\x00-\x1f"\\\\]'
"""What Jackson escapes in a string: control characters, the quote, the backslash."""


@functools.cache
def _null_text() -> pa.Scalar:
    # Made on first use: pyarrow imports pandas (half a second) the first time it
    # converts a Python value, and Spark's planner and commit processes, which import
    # this module fresh every batch, convert none.
    return pa.scalar("null", pa.string())


def json_lines(batch: pa.RecordBatch | pa.Table) -> bytes:
    """One JSON object per row, each followed by ``\\n``, as Spark's json writer
    writes the rows into a part file."""
    return bytes(json_lines_buffer(batch).to_pybytes())


def json_lines_buffer(batch: pa.RecordBatch | pa.Table) -> pa.Buffer:
    """``json_lines`` as Arrow's buffer, without a copy (what a writer of JSON Lines
    writes)."""
    columns = [_combined(batch.column(i)) for i in range(batch.num_columns)]
    return _data_of(_objects(batch.schema.names, columns, batch.num_rows, end="}\n"))


def _data_of(lines: pa.Array) -> pa.Buffer:
    """The text values of ``lines`` back to back (a slice of its data buffer)."""
    if len(lines) == 0:
        return pa.py_buffer(b"")
    width = 8 if pa.types.is_large_string(lines.type) else 4
    _validity, offsets, data = lines.buffers()
    first, last = lines.offset * width, (lines.offset + len(lines)) * width
    start = int.from_bytes(offsets[first:first + width].to_pybytes(), "little")
    stop = int.from_bytes(offsets[last:last + width].to_pybytes(), "little")
    return data[start:stop]


def json_objects(batch: pa.RecordBatch | pa.Table) -> pa.Array:
    """Each row as one JSON object (a string array), as Spark's ``to_json(struct(*))``
    writes it."""
    columns = [_combined(batch.column(i)) for i in range(batch.num_columns)]
    return _objects(batch.schema.names, columns, batch.num_rows)


def json_values(array: pa.Array) -> pa.Array:
    """Each value's JSON text (a string array; null where the value is null)."""
    return _values(_plain(array))


def _combined(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column


def _plain(array: pa.Array) -> pa.Array:
    """The array without an offset into its buffers (child arrays are then indexed by
    offsets that start where they say)."""
    if array.offset == 0:
        return array
    return pc.take(array, pa.array(range(len(array)), pa.int64()))


def _objects(names: list[str], columns: list[pa.Array], rows: int,
             end: str = "}") -> pa.Array:
    """``{"a":1,"b":"x"}`` per row from each field's values; null fields left out.
    ``end`` closes each object (``}\\n`` makes lines)."""
    if not columns:
        return pa.array(["{" + end] * rows, pa.string())
    values = [_values(_plain(column)) for column in columns]
    if not any(v.null_count for v in values):
        # No field left out anywhere: one join of the names and the values.
        parts: list[Any] = []
        for i, (name, value) in enumerate(zip(names, values, strict=True)):
            parts += [pa.scalar(("{" if i == 0 else ",") + _quoted(name) + ":"), value]
        return pc.binary_join_element_wise(*parts, pa.scalar(end), pa.scalar(""))
    # Each member carries a trailing comma (null stays null, and is joined as ""); the
    # last comma is trimmed: no JSON value ends in one. (Arrow's null_handling="skip"
    # drops the rows whose members are all null.)
    members = [pc.binary_join_element_wise(pa.scalar(_quoted(name) + ":"),
                                           value, pa.scalar(","), pa.scalar(""))
               for name, value in zip(names, values, strict=True)]
    body = pc.binary_join_element_wise(*members, pa.scalar(""), null_handling="replace",
                                       null_replacement="")
    return pc.binary_join_element_wise(pa.scalar("{"), pc.utf8_rtrim(body, ","),
                                       pa.scalar(end), pa.scalar(""))


def _values(array: pa.Array) -> pa.Array:
    t = array.type
    if pa.types.is_dictionary(t):
        return _values(_plain(array.dictionary_decode()))
    for test, encode in _ENCODERS:
        if test(t):
            return encode(array)
    return _python_text(array)


def _null_array(array: pa.Array) -> pa.Array:
    return pa.nulls(len(array), pa.string())


def _boolean(array: pa.Array) -> pa.Array:
    return pc.if_else(array, pa.scalar("true"), pa.scalar("false"))


def _integer(array: pa.Array) -> pa.Array:
    return pc.cast(array, pa.string())


def _floating(array: pa.Array) -> pa.Array:
    """Java's ``Double.toString`` (``sparktext.double_text``); NaN and infinities as
    Jackson writes them: quoted."""
    text = double_text(array)
    special = pc.and_(pc.is_valid(array), pc.invert(pc.is_finite(array)))
    if not pc.any(special).as_py():
        return text
    return pc.if_else(special, _quoted_text(text), text)


def _decimal(array: pa.Array) -> pa.Array:
    return decimal_text(array, plain=False)  # Jackson writes BigDecimal.toString


def _string(array: pa.Array) -> pa.Array:
    text = array.cast(pa.string()) if not pa.types.is_string(array.type) else array
    if pc.any(pc.match_substring_regex(text, _ESCAPED)).as_py():
        text = _escaped(text)
    return _quoted_text(text)


def _quoted_text(text: pa.Array) -> pa.Array:
    """Text that needs no escapes, in quotes."""
    return pc.binary_join_element_wise(pa.scalar('"'), text, pa.scalar('"'), pa.scalar(""))


def _escaped(text: pa.Array) -> pa.Array:
    text = pc.replace_substring(text, "\\", "\\\\")
    text = pc.replace_substring(text, '"', '\\"')
    if pc.any(pc.match_substring_regex(text, _CONTROL)).as_py():
        for code in range(0x20):
            char = chr(code)
            escape = _JACKSON_ESCAPES.get(char, f"\\u{code:04X}")
            text = pc.replace_substring(text, char, escape)
    return text


def _binary(array: pa.Array) -> pa.Array:
    encoded = [None if v is None else base64.b64encode(v).decode("ascii")
               for v in array.to_pylist()]
    return _string(pa.array(encoded, pa.string()))


def _date(array: pa.Array) -> pa.Array:
    return _quoted_text(date_text(array))


def _timestamp(array: pa.Array) -> pa.Array:
    return _quoted_text(json_timestamp_text(array))


def _list(array: pa.Array) -> pa.Array:
    if pa.types.is_fixed_size_list(array.type):
        array = array.cast(pa.list_(array.type.value_field))
    offsets = array.offsets
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    elements = _values(_plain(array.values.slice(start, end - start)))
    elements = pc.fill_null(elements, _null_text())
    rebased = pc.subtract(offsets, offsets[0])
    return _bracketed(rebased, elements, array, "[", "]")


def _map(array: pa.Array) -> pa.Array:
    offsets = array.offsets
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    entries = array.values  # the struct<key, value> of every map, unsliced
    keys = _plain(entries.field(0).slice(start, end - start))
    items = _plain(entries.field(1).slice(start, end - start))
    key_text = _string(map_key_text(keys))
    pairs = pc.binary_join_element_wise(key_text, pa.scalar(":"),
                                        pc.fill_null(_values(items), _null_text()),
                                        pa.scalar(""))
    rebased = pc.subtract(offsets, offsets[0])
    return _bracketed(rebased, pairs, array, "{", "}")


def _bracketed(offsets: pa.Array, parts: pa.Array, owner: pa.Array, opening: str,
               closing: str) -> pa.Array:
    lists = pa.ListArray.from_arrays(offsets.cast(pa.int32()), parts,
                                     mask=owner.is_null())
    joined = pc.binary_join(lists, pa.scalar(","))
    return pc.binary_join_element_wise(pa.scalar(opening), joined, pa.scalar(closing),
                                       pa.scalar(""))


def _struct(array: pa.Array) -> pa.Array:
    t = array.type
    names = [t.field(i).name for i in range(t.num_fields)]
    children = array.flatten()  # each field within the struct's offset and length
    objects = _objects(names, children, len(array))
    return pc.if_else(array.is_valid(), objects, pa.scalar(None, pa.string()))


def _python_text(array: pa.Array) -> pa.Array:
    return _string(pa.array([None if v is None else str(v) for v in array.to_pylist()],
                            pa.string()))


def _quoted(name: str) -> str:
    """A field name as Jackson writes it (its escapes; ``json.dumps`` would write
    control characters with lowercase hex digits)."""
    return str(_string(pa.array([name], pa.string()))[0].as_py())


_ENCODERS: list[tuple[Callable[[pa.DataType], bool], Callable[[pa.Array], pa.Array]]] = [
    (pa.types.is_null, _null_array),
    (pa.types.is_boolean, _boolean),
    (pa.types.is_integer, _integer),
    (pa.types.is_floating, _floating),
    (pa.types.is_decimal, _decimal),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), _string),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t)
     or pa.types.is_fixed_size_binary(t), _binary),
    (pa.types.is_date, _date),
    (pa.types.is_timestamp, _timestamp),
    (pa.types.is_map, _map),  # before lists: a map is a list of entries to Arrow
    (lambda t: pa.types.is_list(t) or pa.types.is_large_list(t)
     or pa.types.is_fixed_size_list(t), _list),
    (pa.types.is_struct, _struct),
]
