"""The model check at its small bound (``./run modelcheck`` runs the full one)."""

from __future__ import annotations

import pytest

from sparkeos.testing.modelcheck import MUTANTS, SMALL, explore


def test_small_bound_reaches_no_violation():
    report = explore(SMALL)
    assert report.violations == 0, report.shortest
    assert report.schedules > 20_000 and len(report.states) > 150_000
    assert set(report.by_scenario) == {s.name for s in SMALL.scenarios}
    assert report.summary().startswith(f"model check: schedules={report.schedules} states=")


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_every_fixed_bug_is_found_when_put_back(mutant):
    """Each of the five concurrency bugs of the protocol, restored: the check must
    report it (a check that cannot fail proves nothing)."""
    report = explore(SMALL, mutant, stop_on_first=True)
    assert report.violations == 1, f"{mutant} went unnoticed in {report.schedules} schedules"
    assert report.shortest is not None and report.shortest.trace
