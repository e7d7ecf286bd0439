"""Real-time mode's per-partition protocol, model-checked at its small bound
(``./run modelcheck --bound realtime-full`` runs the full one)."""

from __future__ import annotations

import pytest

from sparkeos.testing.modelcheck import realtime
from sparkeos.testing.modelcheck.__main__ import main


def test_small_bound_reaches_no_violation() -> None:
    report = realtime.explore(realtime.SMALL)
    assert not report.failures, report.failures[0]
    assert report.schedules > 5_000


@pytest.mark.parametrize("mutant", sorted(realtime.MUTANTS))
def test_every_mutant_is_found(mutant: str) -> None:
    """A zombie's commit, a destination without a fence, a replay from the wrong
    position: each put back, the check reports duplicated rows."""
    report = realtime.explore(realtime.SMALL, mutant, stop_on_first=True)
    assert len(report.failures) == 1, f"{mutant} went unnoticed in {report.schedules}"
    _scenario, violations, trace = report.failures[0]
    assert any("committed twice" in v for v in violations) and trace


def test_the_command_runs_a_real_time_bound_and_fails_on_a_mutant(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--bound", "realtime-small", "--mutant", "zombie-commits",
                 "--stop-on-first"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATION: rows committed twice" in out and "shortest failing schedule" in out
    with pytest.raises(SystemExit):
        main(["--bound", "realtime-small", "--mutant", "last-outcome-wins"])
