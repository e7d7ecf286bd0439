"""The job runner's one retry: a run Spark failed because its Python worker did not
connect back in Spark's fixed 10 s is started again, once; nothing else is."""

from __future__ import annotations

from collections.abc import Callable

from sparkeos.core.faults import CRASH_EXIT_CODE
from sparkeos.testing.job import (
    RETRIED_NOTE,
    WORKER_NOT_STARTED,
    JobResult,
    again_if_worker_not_started,
)

NOT_STARTED = JobResult(1, "", f"SparkException: {WORKER_NOT_STARTED}.")


def runs(*results: JobResult) -> tuple[list[JobResult], Callable[[], JobResult]]:
    made: list[JobResult] = []
    pending = list(results)

    def run() -> JobResult:
        made.append(pending.pop(0))
        return made[-1]

    return made, run


def test_a_run_whose_python_worker_did_not_start_runs_again_once():
    made, run = runs(NOT_STARTED, JobResult(0, "ok", ""))
    result = again_if_worker_not_started(run)
    assert len(made) == 2 and result.returncode == 0 and result.stdout == "ok"
    assert WORKER_NOT_STARTED in result.stderr and RETRIED_NOTE in result.stderr


def test_the_second_failure_is_the_result():
    made, run = runs(NOT_STARTED, NOT_STARTED, JobResult(0, "", ""))
    result = again_if_worker_not_started(run)
    assert len(made) == 2 and result.returncode == 1


def test_other_failures_and_kills_are_not_run_again():
    for first in (JobResult(1, "", "TransactionAbortedError"),
                  JobResult(CRASH_EXIT_CODE, "", WORKER_NOT_STARTED),
                  JobResult(0, "", "")):
        made, run = runs(first, JobResult(0, "", ""))
        assert again_if_worker_not_started(run) is first
        assert len(made) == 1
