"""The pyspark versions sparkeos is proven on, and the refusal of any other.

Both routes lean on how Spark calls Python: foreachBatch on the batch's DataFrame and
its query's local properties, the format route on the Python streaming writer's three
processes (``core/streaming/streamformat.py``). ``./run test-spark-versions`` runs the conformance
of both routes on every minor in ``SUPPORTED``; a pyspark outside them is refused before
anything is written, unless ``SPARKEOS_UNTESTED_PYSPARK=1`` says to try it anyway.
"""

from __future__ import annotations

import functools
import logging
import os
import re

from sparkeos.core.errors import UnsupportedSparkError

SUPPORTED: tuple[tuple[int, int], ...] = ((4, 2), (4, 3))
"""(major, minor) of every pyspark the conformance suites ran on (pyproject.toml's
range). 4.0 has no Arrow streaming writer, which the format route is built on; 4.1 has no
admission control for Python streaming sources (``pyspark.sql.streaming.datasource``:
``ReadLimit``, ``SupportsTriggerAvailableNow``), which the STOMP source is built on."""
UNTESTED_ENV = "SPARKEOS_UNTESTED_PYSPARK"

log = logging.getLogger(__name__)


def minor_of(version: str) -> tuple[int, int] | None:
    """``(4, 3)`` from ``"4.3.0"`` or ``"4.3.0.dev1"``; None if it is not a version."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def supported(version: str) -> bool:
    return minor_of(version) in SUPPORTED


@functools.lru_cache(maxsize=1)
def check_pyspark() -> str:
    """The running pyspark's version; ``UnsupportedSparkError`` if it is not one sparkeos
    was proven on (a warning instead with ``SPARKEOS_UNTESTED_PYSPARK=1``)."""
    import pyspark

    version = str(pyspark.__version__)
    if supported(version):
        return version
    proven = ", ".join(f"{major}.{minor}" for major, minor in SUPPORTED)
    if os.environ.get(UNTESTED_ENV) == "1":
        log.warning("pyspark %s is not one sparkeos was proven on (%s); running it anyway "
                    "as %s=1 asks", version, proven, UNTESTED_ENV)
        return version
    raise UnsupportedSparkError(
        f"pyspark {version} is not one sparkeos was proven on ({proven})",
        fix=f"install a proven pyspark (pip install 'pyspark>=4.2,<4.4'); to try this one "
        f"anyway, set {UNTESTED_ENV}=1 on the driver and the executors, and run the "
        "conformance suite on it first (./run test-spark-versions)")
