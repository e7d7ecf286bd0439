"""The fault plan's sources: the environment, else the plan directory of a process that
was started before its plan was known (sparkeos.testing.ahead)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkeos.core.faults import (
    ENV_VAR,
    LATE_DIR_ENV,
    SOURCE_ENV,
    FaultPlan,
    SourceFaults,
    plan_setting,
)


def test_the_environment_gives_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "after_decided@2")
    monkeypatch.delenv(LATE_DIR_ENV, raising=False)
    plan = FaultPlan.from_env()
    assert (plan.point, plan.batch_id) == ("after_decided", 2)


def test_a_late_plan_comes_from_its_directory(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    monkeypatch.setenv(LATE_DIR_ENV, str(tmp_path))
    assert FaultPlan.from_env().point is None  # no file yet: no plan
    (tmp_path / ENV_VAR).write_text("after_first_commit@1\n")
    (tmp_path / SOURCE_ENV).write_text("source_before_ack@3")
    plan = FaultPlan.from_env()
    assert (plan.point, plan.batch_id) == ("after_first_commit", 1)
    source = SourceFaults()
    assert (source.point, source.count) == ("source_before_ack", 3)


def test_the_environment_wins_over_the_directory(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LATE_DIR_ENV, str(tmp_path))
    (tmp_path / ENV_VAR).write_text("after_begun@1")
    monkeypatch.setenv(ENV_VAR, "after_finished@4")
    assert plan_setting(ENV_VAR) == "after_finished@4"
