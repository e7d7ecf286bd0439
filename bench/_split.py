"""The sparkeos adapter's own split of a batch (``BatchMetrics``), as every bench prints
it."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def median_of(metrics: Sequence[Any], attr: str) -> float:
    values = [float(getattr(m, attr)) for m in metrics]
    return statistics.median(values) if values else 0.0


def adapter_split(metrics: Sequence[Any]) -> str:
    """Medians in ms: ``total T = phase 1 job P + decide D + commit C + other O;
    participants N`` (other: recovery, schema and destination checks, begun)."""
    other = [m.total_ms - m.prepare_ms - m.decide_ms - m.commit_ms for m in metrics]
    return (f"total {median_of(metrics, 'total_ms'):.1f} = phase 1 job "
            f"{median_of(metrics, 'prepare_ms'):.1f} + decide "
            f"{median_of(metrics, 'decide_ms'):.1f} + commit "
            f"{median_of(metrics, 'commit_ms'):.1f} + other "
            f"{statistics.median(other) if other else 0.0:.1f}; participants "
            f"{median_of(metrics, 'partitions'):.0f}")
