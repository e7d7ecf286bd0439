"""Two FileSinks of one query in one directory, under repeated driver kills (issue 8,
defect 1: part names once left out the sink name, and the second sink took the first
one's files for its own)."""

from __future__ import annotations

import os
from typing import Any

import pyarrow.parquet as pq
import pytest

from sparkeos.connectors.file import committed_files
from sparkeos.testing.conformance import assert_exactly_once
from sparkeos.testing.job import JobSpec, run_job, run_job_process, write_input

from .two_sinks import NAMES


def sink_ids(path: str, name: str) -> list[int]:
    return [i for f in committed_files(path) if f"-{name}-" in os.path.basename(f)
            for i in pq.read_table(f).column("id").to_pylist()]


@pytest.mark.chaos
def test_two_sinks_one_directory_under_repeated_kills(tmp_path: Any) -> None:
    expected = write_input(str(tmp_path / "in"),
                           [range(b * 100, b * 100 + 20) for b in range(3)])
    out = str(tmp_path / "out")
    spec = JobSpec(input=str(tmp_path / "in"), checkpoint=str(tmp_path / "ckpt"),
                   sink={"factory": "integration.connectors.file.two_sinks:two_file_sinks",
                         "kwargs": {"path": out}},
                   mode="function")
    # The same points fire in both sinks' adapters: a kill lands in the first sink's
    # protocol and, on the next run, the second's (the first replays its decided batch).
    for fault in ("after_decided@0", "after_first_commit@1", "after_all_prepared@1",
                  "after_finished@2"):
        crashed = run_job_process(spec, fault)
        assert crashed.crashed, f"{fault} did not fire:\n{crashed.tail()}"
    done = run_job(spec)
    assert done.returncode == 0, done.tail()
    for name in NAMES:
        assert_exactly_once(sink_ids(out, name), expected)
