"""JSON text of Arrow data as Spark's own JSON writer (``df.write.json``, ``to_json``)
writes it, column at a time in Arrow's compute kernels: no per-row Python path, no
pandas conversion.

Spark writes through Jackson with its default options, and so does this module:

* a row is one object; a null field is left out (``ignoreNullFields``), at every level
  of nesting; array elements and map values that are null are written as ``null``;
* integers and decimals in full (a decimal as Java's ``BigDecimal.toString``: plain,
  or ``1.2345E-8`` / ``0E-18`` when its exponent is below -6, as Arrow prints it too);
* floating point as Java's ``Double.toString`` / ``Float.toString`` (``1.0``,
  ``1.0E20``, ``1.0E-4``), NaN and infinities as the strings ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"``. The digits are the shortest that read back as the
  same value (Java 19+); Java 17's ``Double.toString`` prints a longer form for a few
  values, which reads back the same;
* strings with Jackson's escapes (``\\"``, ``\\\\``, ``\\n``... and ``\\u00XX`` for the
  other control characters; everything else as UTF-8);
* binary as base64; dates as ``yyyy-MM-dd``; timestamps as
  ``yyyy-MM-dd'T'HH:mm:ss.SSSXXX`` in the column's time zone (Spark's session time
  zone: the zone the batch's Arrow type carries), ``Z`` for UTC; timestamps without
  a time zone as ``yyyy-MM-dd'T'HH:mm:ss.SSS``;
* maps as objects, keys as text.

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

_JACKSON_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_CONTROL = "[\x00-\x1f]"
_ESCAPED = '[\x00-\x1f"\\\\]'
"""What Jackson escapes in a string: control characters, the quote, the backslash."""
_ARROW_NUMBER = r"^(?P<sign>-?)(?P<whole>\d+)(?:\.(?P<fraction>\d+))?(?:e\+?(?P<exp>-?\d+))?$"
"""How Arrow prints a finite float: ``-0.00001``, ``1.5e-7``, ``1e+20``."""


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
    """Java's ``Double.toString`` / ``Float.toString`` from Arrow's shortest digits:
    plain with at least one fraction digit for 1e-3 <= |x| < 1e7, else
    ``d.dddE<exponent>``.

    In that range (and for zeros) Arrow prints the same digits plainly too, without
    the fraction of a whole number: ``5`` for Java's ``5.0``. Those values take that
    path (a cast and a suffix: a third of the time of the general one); the others,
    NaN and infinities go through ``_floating_general``."""
    text = pc.cast(array, pa.string())  # shortest round-trip digits, Arrow's notation
    magnitude = pc.abs(array)
    plain = pc.fill_null(pc.or_(pc.equal(array, 0), pc.and_(
        pc.greater_equal(magnitude, 1e-3), pc.less(magnitude, 1e7))), True)
    fast = pc.if_else(pc.match_substring(text, "."), text,
                      pc.binary_join_element_wise(text, pa.scalar(".0"), pa.scalar("")))
    if pc.all(plain).as_py():
        return fast
    other = pc.invert(plain)
    return pc.replace_with_mask(fast, other, _floating_general(array.filter(other)))


def _floating_general(array: pa.Array) -> pa.Array:
    """``_floating`` for any value: from Arrow's digits and exponent."""
    text = pc.cast(array, pa.string())
    parts = pc.extract_regex(text, _ARROW_NUMBER)  # null for nan, inf
    negative = pc.fill_null(pc.equal(parts.field("sign"), "-"), False)
    whole, fraction = parts.field("whole"), parts.field("fraction")
    exponent = pc.cast(pc.if_else(pc.equal(parts.field("exp"), ""), pa.scalar("0"),
                                  parts.field("exp")), pa.int64())
    digits_all = pc.binary_join_element_wise(whole, fraction, pa.scalar(""))
    leading = pc.subtract(pc.utf8_length(digits_all),
                          pc.utf8_length(pc.utf8_ltrim(digits_all, "0")))
    digits = pc.utf8_rtrim(pc.utf8_ltrim(digits_all, "0"), "0")
    # The decimal exponent of the first significant digit.
    point = pc.add(pc.cast(pc.utf8_length(whole), pa.int64()), exponent)
    sci = pc.subtract(pc.subtract(point, pc.cast(leading, pa.int64())), 1)
    is_zero = pc.equal(pc.utf8_length(digits), 0)
    present = set(pc.unique(sci).to_pylist()) - {None}  # None: NaN, infinities, nulls
    plain = range(-3, 7)  # Java's plain range
    out = (_scientific(digits, sci) if present - set(plain)
           else pa.nulls(len(digits), pa.string()))
    for e in plain:  # one exponent at a time (scalar slices)
        if e in present:
            out = pc.if_else(pc.equal(sci, e), _plain_at(digits, e), out)
    out = pc.if_else(is_zero, pa.scalar("0.0"), out)
    out = pc.if_else(negative, pc.binary_join_element_wise(pa.scalar("-"), out,
                                                           pa.scalar("")), out)
    out = pc.if_else(pc.is_nan(array), pa.scalar('"NaN"'), out)
    out = pc.if_else(pc.is_inf(array), pc.if_else(pc.less(array, 0), pa.scalar(
        '"-Infinity"'), pa.scalar('"Infinity"')), out)
    return pc.if_else(array.is_valid(), out, pa.scalar(None, pa.string()))


def _scientific(digits: pa.Array, exponent: pa.Array) -> pa.Array:
    first = pc.utf8_slice_codeunits(digits, 0, 1)
    rest = pc.utf8_slice_codeunits(digits, 1)
    rest = pc.if_else(pc.equal(pc.utf8_length(rest), 0), pa.scalar("0"), rest)
    return pc.binary_join_element_wise(first, pa.scalar("."), rest, pa.scalar("E"),
                                       pc.cast(exponent, pa.string()), pa.scalar(""))


def _plain_at(digits: pa.Array, exponent: int) -> pa.Array:
    """``digits`` with the first digit at 10**exponent, as Java prints it plainly."""
    if exponent < 0:
        return pc.binary_join_element_wise(pa.scalar("0." + "0" * (-exponent - 1)), digits,
                                           pa.scalar(""))
    width = exponent + 1
    whole = pc.utf8_rpad(pc.utf8_slice_codeunits(digits, 0, width), width=width,
                         padding="0")
    fraction = pc.utf8_slice_codeunits(digits, width)
    fraction = pc.if_else(pc.equal(pc.utf8_length(fraction), 0), pa.scalar("0"), fraction)
    return pc.binary_join_element_wise(whole, fraction, pa.scalar("."))


def _decimal(array: pa.Array) -> pa.Array:
    return pc.cast(array, pa.string())  # Java's BigDecimal.toString, digit for digit


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
    return _string(pc.cast(array.cast(pa.date32()), pa.string()))


def _timestamp(array: pa.Array) -> pa.Array:
    """``yyyy-MM-dd'T'HH:mm:ss.SSS`` (+ ``XXX`` when zoned), formatted from each value's
    local time in milliseconds (``_timestamp_text``): Arrow's ``strftime`` looks the
    zone up value by value, 20 times slower."""
    import numpy as np

    t = array.type
    micros = pc.fill_null(pc.cast(array, pa.timestamp("us", tz=t.tz), safe=False)
                          .cast(pa.int64()), 0)  # ns: Spark sends us; SSS keeps ms
    utc_millis = np.floor_divide(micros.to_numpy(), 1000)  # floor: 1969 keeps .999
    if t.tz is None:
        local = utc_millis
        offsets = None
    else:
        local_micros = pc.local_timestamp(pc.cast(micros, pa.timestamp("us", tz=t.tz)))
        local = np.floor_divide(local_micros.cast(pa.int64()).to_numpy(), 1000)
        offsets = _zone_offsets(local - utc_millis)
    text = _timestamp_text(local)
    if offsets is not None:
        text = pc.binary_join_element_wise(text, offsets, pa.scalar(""))
    quoted = _quoted_text(text)
    return pc.if_else(array.is_valid(), quoted, pa.scalar(None, pa.string()))


_ARROW_YEARS = (-62135596800000, 253402300799999)
"""0001-01-01T00:00:00.000 and 9999-12-31T23:59:59.999 in milliseconds since the
epoch: between them Arrow's text of a timestamp is numpy's, with a space for the T."""


def _timestamp_text(millis: Any) -> pa.Array:
    """``yyyy-MM-ddTHH:mm:ss.SSS`` of each local time (milliseconds since the epoch):
    by Arrow's cast where every year has four digits (the same text, five times
    faster), else by numpy's ``datetime_as_string``."""
    import numpy as np

    stamps = millis.view("datetime64[ms]")
    if len(millis) and _ARROW_YEARS[0] <= millis.min() and millis.max() <= _ARROW_YEARS[1]:
        text = pc.cast(pa.array(stamps, pa.timestamp("ms")), pa.string())
        return pc.replace_substring(text, " ", "T", max_replacements=1)
    return pa.array(np.datetime_as_string(stamps, unit="ms"), pa.string())


def _zone_offsets(offset_millis: Any) -> pa.Array:
    """Java's ``XXX`` of each offset from UTC: ``Z``, ``-08:00``, ``+05:45``."""
    import numpy as np

    distinct, index = np.unique(offset_millis, return_inverse=True)
    texts = []
    for millis in distinct.tolist():
        seconds = millis // 1000
        sign, seconds = ("-", -seconds) if seconds < 0 else ("+", seconds)
        hours, rest = divmod(seconds, 3600)
        # XXX writes hours and minutes only (a local mean time's seconds are dropped).
        texts.append("Z" if seconds == 0 else f"{sign}{hours:02d}:{rest // 60:02d}")
    return pc.take(pa.array(texts, pa.string()), pa.array(index.astype("int64")))


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
    key_text = _string(_map_keys(keys))
    pairs = pc.binary_join_element_wise(key_text, pa.scalar(":"),
                                        pc.fill_null(_values(items), _null_text()),
                                        pa.scalar(""))
    rebased = pc.subtract(offsets, offsets[0])
    return _bracketed(rebased, pairs, array, "{", "}")


def _map_keys(keys: pa.Array) -> pa.Array:
    """Spark names a map's key by its ``toString``: text as it is, numbers as digits."""
    if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
        return keys
    if pa.types.is_floating(keys.type):
        return pc.replace_substring(_floating(keys), '"', "")
    return pc.cast(keys, pa.string())


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
