"""sparkeos.testing.ahead: a process is started ahead only after a run that kills its
driver, which its test runs again in the same settings."""

from __future__ import annotations

import pytest

from sparkeos.core.faults import ENV_VAR, SOURCE_ENV
from sparkeos.testing.ahead import restart_follows


@pytest.mark.parametrize("plan", [
    {ENV_VAR: "after_decided@1"}, {ENV_VAR: "kill_driver_after_first_prepare@2"},
    {ENV_VAR: "after_first_commit"}, {ENV_VAR: "epoch_before_commit@3"},
    {ENV_VAR: "kill_once_spark_counted@1"}, {SOURCE_ENV: "source_after_ack@2"},
])
def test_a_run_that_kills_its_driver_is_restarted(plan: dict[str, str]) -> None:
    assert restart_follows(plan)


@pytest.mark.parametrize("plan", [
    {}, {ENV_VAR: "task_fail_after_prepare@1"}, {ENV_VAR: "kill_task_mid_write@1"},
    {ENV_VAR: "hold_in_phase_1@1"}, {ENV_VAR: "speculate_copy_wins@1"},
    {SOURCE_ENV: "source_pause_after_spool"}, {ENV_VAR: "epoch_worker_killed@1"},
])
def test_other_runs_leave_no_process_waiting(plan: dict[str, str]) -> None:
    assert not restart_follows(plan)
