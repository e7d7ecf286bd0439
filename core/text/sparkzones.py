"""A session time zone as Spark resolves it, and its offsets from UTC, column at a time.

Spark names a timestamp's zone by ``spark.sql.session.timeZone`` and resolves it with
Java's ``ZoneId.of(id, SHORT_IDS)`` (after widening ``+1:30`` to ``+01:30``): a short
ID (``PST`` is ``America/Los_Angeles``, ``EST`` is ``-05:00``), ``Z``, an offset
(``+05:45``, ``-13:33:33``), ``UTC``/``GMT``/``UT`` alone or with an offset
(``GMT+8``), else a region. ``zone`` does the same.

A region's offsets come from IANA's data in the ``tzdata`` package, built as Java builds
its tzdb (the main data, without ``backzone``: ``Europe/Amsterdam`` before 1970 is
Brussels' history in both; a system's files may carry the older local times). Java's
``ZoneRules`` semantics, reproduced on arrays of instants:

* before the first transition, the zone's first offset (a local mean time such as
  ``-07:52:58``);
* between transitions, the offset after the last one passed;
* after the last listed transition, the yearly rule (the TZif footer, a POSIX TZ string
  such as ``PST8PDT,M3.2.0,M11.1.0``) in every later year, its transitions taken from
  the instant's year and the years around it. The rule repeats every 400 years (the
  Gregorian calendar does), so far years are looked up 400 years at a time nearer.
"""

from __future__ import annotations

import functools
import re
import struct
from dataclasses import dataclass

import numpy as np

from sparkeos.core.errors import ConfigurationError

SESSION_TIME_ZONE = "spark.sql.session.timeZone"
_SHORT_IDS = {
    "ACT": "Australia/Darwin", "AET": "Australia/Sydney",
    "AGT": "America/Argentina/Buenos_Aires", "ART": "Africa/Cairo",
    "AST": "America/Anchorage", "BET": "America/Sao_Paulo", "BST": "Asia/Dhaka",
    "CAT": "Africa/Harare", "CNT": "America/St_Johns", "CST": "America/Chicago",
    "CTT": "Asia/Shanghai", "EAT": "Africa/Addis_Ababa", "ECT": "Europe/Paris",
    "EST": "-05:00", "HST": "-10:00", "IET": "America/Indiana/Indianapolis",
    "IST": "Asia/Kolkata", "JST": "Asia/Tokyo", "MIT": "Pacific/Apia",
    "MST": "-07:00", "NET": "Asia/Yerevan", "NST": "Pacific/Auckland",
    "PLT": "Asia/Karachi", "PNT": "America/Phoenix", "PRT": "America/Puerto_Rico",
    "PST": "America/Los_Angeles", "SST": "Pacific/Guadalcanal", "VST": "Asia/Ho_Chi_Minh",
}
"""Java's ``ZoneId.SHORT_IDS``, which Spark's ``getZoneId`` resolves with."""
_REGION = re.compile(r"[A-Za-z][A-Za-z0-9~/._+-]+")
_YEARS_400 = 146097
"""Days in 400 Gregorian years: the calendar, and so every yearly rule, repeats after
them."""


@dataclass(frozen=True)
class Zone:
    """A session time zone: a fixed offset (seconds east of UTC), or a region's rules."""

    name: str
    fixed: int | None = None
    region: Region | None = None

    def offsets(self, seconds: np.ndarray) -> np.ndarray:
        """Each instant's offset from UTC in seconds (``seconds`` since the epoch)."""
        if self.fixed is not None:
            return np.full(len(seconds), self.fixed, np.int64)
        assert self.region is not None
        return self.region.offsets(np.asarray(seconds, np.int64))


@functools.cache
def zone(spark_zone: str) -> Zone:
    """The zone Spark means by ``spark_zone`` (a timestamp type's time zone: the
    session's ``spark.sql.session.timeZone``), resolved as Spark's ``getZoneId``; one it
    cannot be is refused (``ConfigurationError``), never guessed."""
    name = re.sub(r"([+-])(\d):", r"\g<1>0\2:", spark_zone, count=1)
    name = re.sub(r"([+-])(\d\d):(\d)$", r"\1\2:0\3", name, count=1)
    name = _SHORT_IDS.get(name, name)
    if len(name) <= 1 or name[0] in "+-":
        return Zone(spark_zone, fixed=_offset_seconds(name, spark_zone))
    for prefix in ("UTC", "GMT", "UT"):
        if name.startswith(prefix):
            rest = name[len(prefix):]
            if not rest:
                return Zone(spark_zone, fixed=0)
            if rest[0] in "+-":
                return Zone(spark_zone, fixed=_offset_seconds(rest, spark_zone))
            break
    return Zone(spark_zone, region=_region(name, spark_zone))


def _offset_seconds(text: str, spark_zone: str) -> int:
    """Java's ``ZoneOffset.of``: ``Z``, ``+h``, ``+hh``, ``+hhmm``, ``+hh:mm``,
    ``+hhmmss``, ``+hh:mm:ss``, at most 18 hours."""
    if text == "Z":
        return 0
    forms = {2: r"(\d)", 3: r"(\d\d)", 5: r"(\d\d)(\d\d)", 6: r"(\d\d):(\d\d)",
             7: r"(\d\d)(\d\d)(\d\d)", 9: r"(\d\d):(\d\d):(\d\d)"}
    match = re.fullmatch(r"[+-]" + forms[len(text)], text) if len(text) in forms else None
    if match is None:
        raise _unknown(spark_zone)
    hours, minutes, seconds = ([int(g) for g in match.groups()] + [0, 0])[:3]
    total = hours * 3600 + minutes * 60 + seconds
    if hours > 18 or minutes > 59 or seconds > 59 or total > 18 * 3600:
        raise _unknown(spark_zone)
    return -total if text[0] == "-" else total


def _unknown(spark_zone: str) -> ConfigurationError:
    return ConfigurationError(
        f"the session time zone {spark_zone!r} ({SESSION_TIME_ZONE}) is not one whose "
        "offsets sparkeos can look up (IANA's data of the tzdata package, Java's offset "
        "forms and short IDs)",
        fix=f"set {SESSION_TIME_ZONE} to a region ID such as 'America/Los_Angeles' or an "
        "offset such as '+01:00'")


# -- regions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """A POSIX TZ string's yearly rule: standard and daylight offsets (seconds east of
    UTC) and when daylight time starts and ends (``Mm.w.d``, ``Jn`` or ``n``, and the
    local time of day in seconds)."""

    standard: int
    daylight: int | None = None
    start: tuple[str, tuple[int, ...], int] | None = None
    end: tuple[str, tuple[int, ...], int] | None = None

    def transitions(self, year: int) -> list[tuple[int, int]]:
        """(instant, offset from it on) of daylight time's start and end in ``year``."""
        if self.daylight is None or self.start is None or self.end is None:
            return []
        start = _rule_day(self.start, year) * 86400 + self.start[2] - self.standard
        end = _rule_day(self.end, year) * 86400 + self.end[2] - self.daylight
        return sorted([(start, self.daylight), (end, self.standard)])


@dataclass(frozen=True)
class Region:
    """A region's transitions (UTC seconds, each with the offset from it on), its offset
    before the first, and the yearly rule after the last."""

    transitions: np.ndarray
    after: np.ndarray
    before: int
    rule: Rule | None

    def offsets(self, seconds: np.ndarray) -> np.ndarray:
        out = np.empty(len(seconds), np.int64)
        listed = (np.ones(len(seconds), bool) if self.rule is None
                  else seconds <= (self.transitions[-1] if len(self.transitions)
                                   else np.iinfo(np.int64).min))
        if listed.any():
            index = np.searchsorted(self.transitions, seconds[listed], side="right") - 1
            safe = np.maximum(index, 0)
            out[listed] = np.where(index >= 0, self.after[safe] if len(self.after)
                                   else self.before, self.before)
        if not listed.all():
            assert self.rule is not None
            out[~listed] = self._by_rule(seconds[~listed], self.rule)
        return out

    def _by_rule(self, seconds: np.ndarray, rule: Rule) -> np.ndarray:
        if rule.daylight is None:
            return np.full(len(seconds), rule.standard, np.int64)
        # Java's ZoneRules: the transitions of the instant's local year decide it. Far
        # years are taken 400 years at a time nearer: the rule repeats.
        last_day = int(self.transitions[-1]) // 86400 if len(self.transitions) else 0
        base = _days_from_civil(int(civil_from_days(np.array([last_day]))[0][0]) + 1, 1, 1)
        days = np.floor_divide(seconds + rule.standard, 86400)
        cycles = np.where(days >= base + _YEARS_400,
                          np.floor_divide(days - base, _YEARS_400), 0)
        shifted = seconds - cycles * _YEARS_400 * 86400
        years = set(np.unique(civil_from_days(days - cycles * _YEARS_400)[0]).tolist())
        moments = sorted(t for y in sorted(years | {y - 1 for y in years}
                                           | {y + 1 for y in years})
                         for t in rule.transitions(y))
        instants = np.array([m for m, _ in moments], np.int64)
        offsets = np.array([o for _, o in moments], np.int64)
        index = np.searchsorted(instants, shifted, side="right") - 1
        # Before the first of them: the offset the earliest one leaves.
        before = rule.standard if moments[0][1] == rule.daylight else rule.daylight
        return np.where(index >= 0, offsets[np.maximum(index, 0)], before)


@functools.cache
def _region(name: str, spark_zone: str) -> Region:
    """A region's rules from the ``tzdata`` package's TZif file."""
    from importlib import resources

    if not _REGION.fullmatch(name) or ".." in name:
        raise _unknown(spark_zone)
    try:
        data = resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).read_bytes()
    except ModuleNotFoundError:
        raise ConfigurationError(
            "the Python package tzdata (IANA's time zone data, as Java's) is missing "
            "where the session time zone's offsets are looked up",
            fix="pip install tzdata (a dependency of sparkeos and pandas)") from None
    except OSError:
        raise _unknown(spark_zone) from None
    try:
        return _read_tzif(data)
    except (ValueError, struct.error, IndexError):
        raise _unknown(spark_zone) from None


def _read_tzif(data: bytes) -> Region:
    """A TZif file (RFC 8536): its 64-bit transitions and time types, and its footer."""
    if data[:4] != b"TZif":
        raise ValueError("not a TZif file")
    counts = struct.unpack(">6l", data[20:44])
    start, width = 44, 4
    if data[4:5] >= b"2":  # skip the 32-bit block: the 64-bit one follows
        isut, isstd, leap, count, types, chars = counts
        start += count * 5 + types * 6 + chars + leap * 8 + isstd + isut
        counts = struct.unpack(">6l", data[start + 20:start + 44])
        start, width = start + 44, 8
    isut, isstd, leap, count, types, chars = counts
    times = np.frombuffer(data, ">i8" if width == 8 else ">i4", count, start).astype(np.int64)
    kinds = np.frombuffer(data, np.uint8, count, start + count * width)
    at = start + count * (width + 1)
    offsets = np.array([struct.unpack(">l", data[at + 6 * i:at + 6 * i + 4])[0]
                        for i in range(types)], np.int64)
    rule = None
    if width == 8:
        end = at + types * 6 + chars + leap * (width + 4) + isstd + isut
        footer = data[end:].split(b"\n")
        if len(footer) > 1 and footer[1]:
            rule = _parse_rule(footer[1].decode("ascii"))
    return Region(times, offsets[kinds.astype(np.int64)], int(offsets[0]), rule)


_NAME = r"(?:[A-Za-z]{3,}|<[+\-A-Za-z0-9]+>)"
_TIME = r"[+-]?\d{1,3}(?::\d{1,2}(?::\d{1,2})?)?"
_TZ_STRING = re.compile(rf"({_NAME})({_TIME})(?:({_NAME})({_TIME})?(?:,([^,]+),([^,]+))?)?")
_DATE = re.compile(rf"(?:M(\d+)\.(\d)\.(\d)|J(\d+)|(\d+))(?:/({_TIME}))?")


def _parse_rule(text: str) -> Rule:
    """A POSIX TZ string (``PST8PDT,M3.2.0,M11.1.0``; its offsets count west of UTC)."""
    match = _TZ_STRING.fullmatch(text)
    if match is None:
        raise ValueError(f"TZ string {text!r}")
    _std, std_time, dst_name, dst_time, start, end = match.groups()
    standard = -_seconds(std_time)
    if dst_name is None:
        return Rule(standard)
    daylight = -_seconds(dst_time) if dst_time else standard + 3600
    if start is None or end is None:
        raise ValueError(f"TZ string {text!r} without its rule")
    return Rule(standard, daylight, _parse_date(start), _parse_date(end))


def _parse_date(text: str) -> tuple[str, tuple[int, ...], int]:
    match = _DATE.fullmatch(text)
    if match is None:
        raise ValueError(f"TZ rule date {text!r}")
    month, week, weekday, julian, day, time = match.groups()
    at = _seconds(time) if time else 7200
    if month:
        return "M", (int(month), int(week), int(weekday)), at
    if julian:
        return "J", (int(julian),), at
    return "n", (int(day),), at


def _seconds(text: str) -> int:
    sign = -1 if text.startswith("-") else 1
    parts = [int(p) for p in text.lstrip("+-").split(":")] + [0, 0]
    return sign * (parts[0] * 3600 + parts[1] * 60 + parts[2])


def _rule_day(date: tuple[str, tuple[int, ...], int], year: int) -> int:
    """Days since the epoch of a rule's date in ``year``."""
    kind, values, _time = date
    if kind == "M":
        month, week, weekday = values
        first = _days_from_civil(year, month, 1)
        day = (weekday - (first + 4) % 7) % 7 + 1 + 7 * (week - 1)
        following = (_days_from_civil(year + 1, 1, 1) if month == 12
                     else _days_from_civil(year, month + 1, 1))
        while day > following - first:
            day -= 7
        return first + day - 1
    jan1 = _days_from_civil(year, 1, 1)
    if kind == "J":  # 1..365, February 29 never counted
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        return jan1 + values[0] - 1 + (1 if leap and values[0] >= 60 else 0)
    return jan1 + values[0]


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * ((month + 9) % 12) + 2) // 5 + day - 1
    return era * _YEARS_400 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def civil_from_days(days: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(year, month, day) of days since 1970-01-01 in the proleptic Gregorian calendar,
    for any year (Howard Hinnant's ``civil_from_days``, on arrays)."""
    z = np.asarray(days, np.int64) + 719468
    era = np.floor_divide(z, _YEARS_400)
    doe = z - era * _YEARS_400
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    return yoe + era * 400 + (month <= 2), month, day


__all__ = ["SESSION_TIME_ZONE", "Zone", "civil_from_days", "zone"]
