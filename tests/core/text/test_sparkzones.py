"""A session time zone as Spark (Java's ``ZoneId``/``ZoneRules``) resolves it and its
offsets (``core/text/sparkzones.py``), without Spark: pinned by what Java 17 gives (measured)
and compared with Python's own reading of the same IANA data."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from importlib import resources

import numpy as np
import pytest

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.text.sparkzones import zone

LA = "America/Los_Angeles"


@pytest.mark.parametrize(("name", "offset_1874", "offset_2100_july"), [
    ("America/Los_Angeles", -28378, -25200), ("PST", -28378, -25200),
    ("Europe/Amsterdam", 1050, 7200),  # Java's tzdb: merged into Brussels (+00:17:30)
    ("Asia/Kathmandu", 20476, 20700), ("+05:45", 20700, 20700), ("-13:33:33", -48813, -48813),
    ("+1:30", 5400, 5400), ("GMT+8", 28800, 28800), ("UTC", 0, 0), ("Z", 0, 0),
    ("EST", -18000, -18000), ("UT-03", -10800, -10800), ("Etc/GMT+8", -28800, -28800)])
def test_zones_resolve_as_javas_zone_id(name: str, offset_1874: int,
                                        offset_2100_july: int) -> None:
    """Offsets as Java 17's ``ZoneId.of(name, SHORT_IDS)`` gives them (measured)."""
    seconds = np.array([-3000000000, 4118083200], np.int64)  # 1874-12-07, 2100-07-01
    assert zone(name).offsets(seconds).tolist() == [offset_1874, offset_2100_july]


def test_an_offset_changes_within_an_hour_at_its_second() -> None:
    """Los Angeles left its local mean time at 1883-11-18 12:07:02 local (20:00:00 UTC):
    the hour of the change is looked up instant by instant."""
    change = -2717640000  # 1883-11-18T20:00:00Z
    seconds = np.array([change - 1, change, change - 1800, change + 1800], np.int64)
    assert zone(LA).offsets(seconds).tolist() == [-28378, -28800, -28378, -28800]


@pytest.mark.parametrize("name", ["Mars/Olympus", "+25:00", "+1:3:4", "../etc/passwd", "X"])
def test_a_zone_that_cannot_be_known_is_refused(name: str) -> None:
    with pytest.raises(ConfigurationError, match=r"spark\.sql\.session\.timeZone"):
        zone(name)


def test_every_region_has_the_offsets_python_reads_from_the_same_data() -> None:
    """Every zone of the tzdata package, at instants from year 1 to 9999 (and many
    around now): the same offsets as ``zoneinfo`` reads from the same file, transitions,
    local mean times and daylight-saving rules alike. Only Java's short IDs differ, by
    design: ``EST`` is Java's fixed -05:00, not the region."""
    rng = np.random.default_rng(48)
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    for name in sorted(zoneinfo.available_timezones() - {"EST", "HST", "MST", "localtime"}):
        with resources.files("tzdata.zoneinfo").joinpath(*name.split("/")).open("rb") as f:
            python = zoneinfo.ZoneInfo.from_file(f, key=name)
        seconds = np.concatenate([rng.integers(-62135337600, 253402041599, 40),
                                  rng.integers(-3000000000, 4200000000, 40)])
        expected = [int((epoch + dt.timedelta(seconds=int(s))).astimezone(python)
                        .utcoffset().total_seconds()) for s in seconds]  # type: ignore[union-attr]
        assert zone(name).offsets(seconds).tolist() == expected, name
