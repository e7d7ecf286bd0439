"""Spark's text of a value, decided in one place for every route that writes it.

Spark spells a value as text where sparkeos writes the same thing:

* a partition directory's name (``partition_names``): ``<column>=<value>``, the value
  as Spark's ``CAST(value AS STRING)`` writes it (``cast_to_string``), escaped as
  ``ExternalCatalogUtils.escapePathName`` escapes it (``escape_path_name``), and
  ``__HIVE_DEFAULT_PARTITION__`` for a null or empty value;
* a value of its JSON writer: dates (``date_text``), timestamps
  (``json_timestamp_text``), decimals (``decimal_text``), doubles (``double_text``);
* a JSON map key (``map_key_text``): the ``toString`` of Spark's internal value, so a
  date's day number and a timestamp's microseconds.

Both routes of the file sink make this text in their tasks from the Arrow batch (the
format route has no JVM to ask), column at a time in Arrow's kernels and numpy.
Generated differential tests compare it with Spark's own writers byte for byte
(``integration/connectors/file/test_generated_text.py``).

What the text depends on, and where this module reads it:

* the session time zone (``spark.sql.session.timeZone``): the zone of the batch's
  timestamp type, which Spark converts the batch with, resolved and looked up as Java
  does (``core/text/sparkzones.py``: local mean times such as Los Angeles' ``-07:52:58``
  before 1883, the daylight-saving rule after the last listed transition); a zone it
  cannot resolve is refused (``ConfigurationError``), never guessed;
* ``spark.sql.ansi.enabled`` (a decimal's ``CAST``: plain digits under ANSI, Spark 4's
  default, else ``BigDecimal.toString``'s ``1E-10``) and
  ``spark.sql.legacy.timeParserPolicy`` (``LEGACY`` formats dates in the hybrid Julian
  calendar: refused): from the running Spark task's local properties, where Spark puts
  the query's session settings, else the defaults Spark's executors take
  (``SessionText.current``).

Not reproduced, and refused where they would make a directory name: floating point
(Java's ``Double.toString`` prints other digits on Java 17 than on Java 19+; in JSON the
shortest digits are written, see ``double_text``), intervals (their text names fields the
Arrow type does not carry).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkeos.core.config import task_property
from sparkeos.core.errors import ConfigurationError, DataRejectedError

from .sparkzones import civil_from_days, zone

DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_ESCAPED = frozenset('"#%\'*/:=?\\\x7f{[]^') | frozenset(chr(c) for c in range(1, 0x20))
"""What Spark's ``ExternalCatalogUtils.escapePathName`` escapes."""
ANSI = "spark.sql.ansi.enabled"
TIME_PARSER_POLICY = "spark.sql.legacy.timeParserPolicy"
SECOND_OFFSETS = "spark.sql.files.supportSecondOffsetFormat"
"""True by default: Spark's JSON writer then writes an offset's seconds (``XXXXX``)."""

_MICROS = 1_000_000
_LAST_DAY = 2932896
"""9999-12-31 in days since the epoch: Java writes later years with a ``+``."""
_ARROW_DAYS = (-719162, _LAST_DAY)
"""0001-01-01 .. 9999-12-31: where Arrow's text of a date or timestamp is Java's."""


# -- path names ----------------------------------------------------------------------------
def escape_path_name(text: str) -> str:
    """``text`` as Spark writes it in a directory name: ``%XX`` (upper-case hex) for each
    character Spark escapes."""
    if not any(ch in _ESCAPED for ch in text):
        return text
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in text)


def unescape_path_name(text: str) -> str:
    """The inverse of ``escape_path_name``."""
    if "%" not in text:
        return text
    out, index = [], 0
    while index < len(text):
        ch = text[index]
        if ch == "%" and _is_hex(text[index + 1:index + 3]):
            out.append(chr(int(text[index + 1:index + 3], 16)))
            index += 3
        else:
            out.append(ch)
            index += 1
    return "".join(out)


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(ch in "0123456789abcdefABCDEF" for ch in text)


def partition_names(column: str, values: pa.Array, session: SessionText) -> list[str]:
    """``<column>=<value>`` for each of ``values`` (Spark's ``getPartitionPathString``):
    the value's ``CAST`` text escaped, ``__HIVE_DEFAULT_PARTITION__`` for null or empty."""
    prefix = escape_path_name(column) + "="
    names = []
    for text in cast_to_string(values, session).to_pylist():
        if not text:
            names.append(prefix + DEFAULT_PARTITION)
        elif "\x00" in text:
            raise DataRejectedError(
                f"a value of partition column {column!r} holds a NUL character, which no "
                "directory name can hold (Spark's own writer fails on it too)",
                fix=f"replace the NUL characters of {column!r} before writing")
        else:
            names.append(prefix + escape_path_name(text))
    return names


def partition_refusal(kind: pa.DataType) -> str | None:
    """Why a column of Arrow type ``kind`` cannot be a partition column (None: it can).
    Spark's ``partitionBy`` takes every atomic type; the refused ones are those whose
    ``CAST`` text sparkeos cannot reproduce."""
    if _castable(kind):
        return None
    if pa.types.is_floating(kind):
        return ("Spark names the directory by Java's Double.toString, whose digits differ "
                "between Java 17 and Java 19+ (9.999999999999999E22 or 1.0E23)")
    if pa.types.is_duration(kind) or pa.types.is_interval(kind):
        return ("Spark names the directory by the interval's fields (INTERVAL '1 02:03:04' "
                "DAY TO SECOND), which its Arrow form does not carry")
    return ("not a type sparkeos names directories by (Spark refuses arrays, maps and "
            "structs as partition columns too)")


def _castable(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                or pa.types.is_integer(kind) or pa.types.is_boolean(kind)
                or pa.types.is_date(kind) or pa.types.is_decimal(kind)
                or pa.types.is_timestamp(kind))


# -- session settings ----------------------------------------------------------------------
@dataclass(frozen=True)
class SessionText:
    """The session settings Spark's text depends on (besides the time zone, which each
    timestamp type carries)."""

    ansi: bool = True
    """``spark.sql.ansi.enabled``: a decimal's ``CAST`` is plain digits under ANSI."""
    time_parser_policy: str = "CORRECTED"
    """``spark.sql.legacy.timeParserPolicy``."""
    second_offsets: bool = True
    """``spark.sql.files.supportSecondOffsetFormat``."""

    @classmethod
    def current(cls) -> SessionText:
        """The settings of the running Spark task (its local properties: the query's
        session settings that were set); a setting not set takes the default Spark's
        executors take (ANSI unless ``SPARK_ANSI_SQL_MODE=false`` in their environment,
        which a Python worker inherits)."""
        ansi = task_property(ANSI)
        policy = task_property(TIME_PARSER_POLICY)
        seconds = task_property(SECOND_OFFSETS)
        return cls(
            ansi=(ansi.strip().lower() == "true" if ansi is not None
                  else os.environ.get("SPARK_ANSI_SQL_MODE") != "false"),
            time_parser_policy=(policy or "CORRECTED").strip().upper(),
            second_offsets=seconds is None or seconds.strip().lower() != "false")

    def check_calendar(self) -> None:
        """Refuse the legacy formatter of dates and timestamps (hybrid Julian calendar)."""
        if self.time_parser_policy == "LEGACY":
            raise ConfigurationError(
                f"{TIME_PARSER_POLICY}=LEGACY: Spark then writes dates and timestamps with "
                "its legacy formatter (the hybrid Julian calendar), whose text sparkeos "
                "does not reproduce",
                fix=f"unset {TIME_PARSER_POLICY} (or set it to CORRECTED) for this query")

    def check_offset_format(self) -> None:
        """Refuse Spark's JSON offsets without seconds (``XXX``), which sparkeos does not
        write: its text of an offset is the default's (``XXXXX``)."""
        if not self.second_offsets:
            raise ConfigurationError(
                f"{SECOND_OFFSETS}=false: Spark then writes JSON timestamps' offsets "
                "without their seconds (-07:52 for -07:52:58, Z for an offset under a "
                "minute), which sparkeos does not reproduce",
                fix=f"unset {SECOND_OFFSETS} (its default, true, is what sparkeos writes) "
                "for this query")


# -- dates and timestamps ------------------------------------------------------------------
def _days(array: pa.Array) -> np.ndarray:
    """Days since the epoch of a date array (nulls as 0)."""
    days = array.cast(pa.date32()) if not pa.types.is_date32(array.type) else array
    return np.asarray(pc.fill_null(days.view(pa.int32()), 0).to_numpy(), np.int64)


def _micros(array: pa.Array) -> np.ndarray:
    """Microseconds since the epoch of a timestamp array (nulls as 0): Spark's own
    precision (nanoseconds are floored)."""
    values = np.asarray(pc.fill_null(array.view(pa.int64()), 0).to_numpy(), np.int64)
    unit = array.type.unit
    if unit == "ns":
        return np.floor_divide(values, 1000)
    return values * {"s": _MICROS, "ms": 1000, "us": 1}[unit]


def local_micros(array: pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """(local time in microseconds, offset from UTC in seconds) of each timestamp: in
    the zone its type carries (Spark's session zone), or as it is without one (a
    timestamp_ntz; no offsets)."""
    micros = _micros(array)
    if array.type.tz is None:
        return micros, None
    offsets = zone(array.type.tz).offsets(np.floor_divide(micros, _MICROS))
    return micros + offsets * _MICROS, offsets


def date_text(array: pa.Array, session: SessionText | None = None) -> pa.Array:
    """``yyyy-MM-dd`` of each date (Spark's ``CAST`` and its JSON writer alike): four
    digits of year, a sign before a year below 0 or above 9999 (Java's ``uuuu``)."""
    (session or SessionText.current()).check_calendar()
    days = _days(array)
    if not len(days) or (_ARROW_DAYS[0] <= days.min() and days.max() <= _ARROW_DAYS[1]):
        text = pc.cast(pa.array(days.astype(np.int32), pa.date32()), pa.string())
    else:
        text = _calendar_text(days)
    return pc.if_else(array.is_valid(), text, pa.scalar(None, pa.string()))


def cast_timestamp_text(array: pa.Array, session: SessionText | None = None) -> pa.Array:
    """Spark's ``CAST(ts AS STRING)``: ``yyyy-MM-dd HH:mm:ss`` in the session zone, then
    the fraction of a second without its trailing zeros (``.0015``; none for whole
    seconds)."""
    (session or SessionText.current()).check_calendar()
    local, _offsets = local_micros(array)
    text = _local_text(local, "us")
    text = pc.replace_substring_regex(text, r"\.?0+$", "")  # 12:00:00.500000 -> .5
    return pc.if_else(array.is_valid(), text, pa.scalar(None, pa.string()))


def json_timestamp_text(array: pa.Array, session: SessionText | None = None) -> pa.Array:
    """Spark's JSON text of timestamps: ``yyyy-MM-dd'T'HH:mm:ss[.SSS][XXXXX]`` in the session
    zone (``Z`` for UTC, seconds in the offset where it has them: ``-07:52:58``), and
    ``yyyy-MM-dd'T'HH:mm:ss.SSS`` for timestamp_ntz. Milliseconds are floored, as
    Java's formatter drops the rest."""
    session = session or SessionText.current()
    session.check_calendar()
    local, offsets = local_micros(array)
    text = pc.replace_substring(_local_text(np.floor_divide(local, 1000), "ms"), " ", "T",
                                max_replacements=1)
    if offsets is not None:
        session.check_offset_format()
        text = pc.binary_join_element_wise(text, _offset_text(offsets), pa.scalar(""))
    return pc.if_else(array.is_valid(), text, pa.scalar(None, pa.string()))


def _local_text(local: np.ndarray, unit: str) -> pa.Array:
    """``yyyy-MM-dd HH:mm:ss.<fraction>`` of local times in ``unit`` (all fraction
    digits): Arrow's text where every year has four digits, else made here."""
    per_second = {"ms": 1000, "us": _MICROS}[unit]
    per_day = 86_400 * per_second
    if not len(local) or (_ARROW_DAYS[0] * per_day <= local.min()
                          and local.max() < (_ARROW_DAYS[1] + 1) * per_day):
        return pc.cast(pa.array(local, pa.timestamp(unit)), pa.string())
    days, within = np.divmod(local, per_day)
    seconds, fraction = np.divmod(within, per_second)
    hours, rest = np.divmod(seconds, 3600)
    clock = [_padded(hours, 2), pa.scalar(":"), _padded(rest // 60, 2), pa.scalar(":"),
             _padded(rest % 60, 2), pa.scalar("."), _padded(fraction, len(str(per_second)) - 1)]
    return pc.binary_join_element_wise(_calendar_text(days), pa.scalar(" "), *clock,
                                       pa.scalar(""))


def _calendar_text(days: np.ndarray) -> pa.Array:
    """``yyyy-MM-dd`` of days since the epoch, in the proleptic Gregorian calendar, for
    any year."""
    year, month, day = civil_from_days(days)
    digits = _padded(np.abs(year), 4)
    signed = pc.if_else(pa.array(year < 0), pc.binary_join_element_wise("-", digits, ""),
                        pc.if_else(pa.array(year > 9999),
                                   pc.binary_join_element_wise("+", digits, ""), digits))
    return pc.binary_join_element_wise(signed, _padded(month, 2), _padded(day, 2), "-")


def _padded(values: np.ndarray, width: int) -> pa.Array:
    return pc.utf8_lpad(pc.cast(pa.array(values, pa.int64()), pa.string()), width=width,
                        padding="0")


def _offset_text(offsets: np.ndarray) -> pa.Array:
    """Java's ``XXX`` of each offset in seconds: ``Z``, ``-08:00``, ``+05:45``, and the
    seconds where the offset has them (``-07:52:58``)."""
    distinct, index = np.unique(offsets, return_inverse=True)
    texts = []
    for total in distinct.tolist():
        sign, size = ("-", -total) if total < 0 else ("+", total)
        hours, rest = divmod(size, 3600)
        minutes, seconds = divmod(rest, 60)
        text = f"{sign}{hours:02d}:{minutes:02d}" + (f":{seconds:02d}" if seconds else "")
        texts.append("Z" if total == 0 else text)
    return pc.take(pa.array(texts, pa.string()), pa.array(index.astype(np.int64)))


# -- numbers -------------------------------------------------------------------------------
def decimal_text(array: pa.Array, plain: bool) -> pa.Array:
    """A decimal's text: ``BigDecimal.toPlainString`` (``0.0000000001``: Spark's ``CAST``
    under ANSI) or ``BigDecimal.toString`` (``1E-10``: its JSON writer, map keys, and
    ``CAST`` without ANSI; Arrow's text is that, digit for digit)."""
    if not plain:
        return pc.cast(array, pa.string())
    scale = array.type.scale
    whole = pa.decimal256(76, 0) if pa.types.is_decimal256(array.type) else pa.decimal128(38, 0)
    # The same bytes at scale 0: the unscaled integer, whose text has no exponent.
    unscaled = pa.Array.from_buffers(whole, len(array), array.buffers(), offset=array.offset)
    digits = pc.cast(unscaled, pa.string())
    if scale <= 0:
        return (digits if scale == 0 else
                pc.binary_join_element_wise(digits, pa.scalar("0" * -scale), pa.scalar("")))
    negative = pc.starts_with(digits, "-")
    padded = pc.utf8_lpad(pc.utf8_ltrim(digits, "-"), width=scale + 1, padding="0")
    text = pc.binary_join_element_wise(pc.utf8_slice_codeunits(padded, 0, -scale),
                                       pc.utf8_slice_codeunits(padded, -scale), ".")
    return pc.if_else(negative, pc.binary_join_element_wise("-", text, ""), text)


_ARROW_NUMBER = r"^(?P<sign>-?)(?P<whole>\d+)(?:\.(?P<fraction>\d+))?(?:e\+?(?P<exp>-?\d+))?$"
"""How Arrow prints a finite float: ``-0.00001``, ``1.5e-7``, ``1e+20``."""


def double_text(array: pa.Array) -> pa.Array:
    """Java's ``Double.toString`` / ``Float.toString`` with Java 19+'s digits (the
    shortest that read back as the same value; Java 17 prints longer ones for a few
    values): plain with at least one fraction digit for 1e-3 <= |x| < 1e7, else
    ``d.dddE<exponent>``; ``NaN``, ``Infinity``, ``-Infinity``.

    In that range (and for zeros) Arrow prints the same digits plainly too, without
    the fraction of a whole number: ``5`` for Java's ``5.0``. Those values take that
    path (a cast and a suffix: a third of the time of the general one); the others,
    NaN and infinities go through ``_double_text_general``."""
    text = pc.cast(array, pa.string())  # shortest round-trip digits, Arrow's notation
    magnitude = pc.abs(array)
    plain = pc.fill_null(pc.or_(pc.equal(array, 0), pc.and_(
        pc.greater_equal(magnitude, 1e-3), pc.less(magnitude, 1e7))), True)
    fast = pc.if_else(pc.match_substring(text, "."), text,
                      pc.binary_join_element_wise(text, pa.scalar(".0"), pa.scalar("")))
    if pc.all(plain).as_py():
        return fast
    other = pc.invert(plain)
    return pc.replace_with_mask(fast, other, _double_text_general(array.filter(other)))


def _double_text_general(array: pa.Array) -> pa.Array:
    """``double_text`` for any value: from Arrow's digits and exponent."""
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
    out = pc.if_else(pc.is_nan(array), pa.scalar("NaN"), out)
    out = pc.if_else(pc.is_inf(array), pc.if_else(pc.less(array, 0), pa.scalar(
        "-Infinity"), pa.scalar("Infinity")), out)
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


# -- CAST and toString ---------------------------------------------------------------------
def cast_to_string(array: pa.Array, session: SessionText) -> pa.Array:
    """Spark's ``CAST(value AS STRING)`` of each value of a type ``partition_refusal``
    takes (null stays null)."""
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return array.cast(pa.string())
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        # UTF8String.fromBytes(...).toString: malformed UTF-8 as U+FFFD.
        return pa.array([None if v is None else v.decode("utf-8", "replace")
                         for v in array.to_pylist()], pa.string())
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind):
        return pc.cast(array, pa.string())
    if pa.types.is_decimal(kind):
        return decimal_text(array, plain=session.ansi)
    if pa.types.is_date(kind):
        return date_text(array, session)
    if pa.types.is_timestamp(kind):
        return cast_timestamp_text(array, session)
    raise ConfigurationError(f"a {kind} value has no CAST text sparkeos reproduces: "
                             f"{partition_refusal(kind)}",
                             fix="cast the column to a string in Spark first")


_KEY_REFUSED = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_fixed_size_binary,
                pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list,
                pa.types.is_struct, pa.types.is_map)


def map_key_text(keys: pa.Array) -> pa.Array:
    """A JSON map key as Spark writes it: the ``toString`` of its internal value. Text
    as it is, numbers as digits (a decimal as ``BigDecimal.toString``, floating point as
    ``double_text``), a date as its day number, a timestamp as its microseconds since
    the epoch (whatever the session zone)."""
    kind = keys.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return keys.cast(pa.string())
    if pa.types.is_floating(kind):
        return double_text(keys)
    if pa.types.is_decimal(kind):
        return decimal_text(keys, plain=False)
    if pa.types.is_date(kind):
        return pc.cast(pa.array(_days(keys)), pa.string())
    if pa.types.is_timestamp(kind):
        return pc.cast(pa.array(_micros(keys)), pa.string())
    if any(refused(kind) for refused in _KEY_REFUSED):
        raise ConfigurationError(
            f"a JSON map key of type {kind}: Spark writes such a key as its JVM object's "
            "toString (binary and arrays as an identity hash such as [B@1928b0a1, structs "
            "as the words of Spark's internal row), which no reader can use and sparkeos "
            "does not reproduce",
            fix="turn the map's keys into strings first, e.g. transform_keys(m, (k, v) -> "
            "to_json(k)) or a cast")
    return pc.cast(keys, pa.string())


__all__ = ["DEFAULT_PARTITION", "SessionText", "cast_timestamp_text",
           "cast_to_string", "date_text", "decimal_text", "double_text", "escape_path_name",
           "json_timestamp_text", "local_micros", "map_key_text", "partition_names",
           "partition_refusal", "unescape_path_name"]

