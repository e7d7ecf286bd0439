"""The demo users run first: it must end with the verified line after real crashes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.chaos
def test_demo_verifies_exactly_once_after_two_crashes(tmp_path):
    """The demo as users run it, with fewer batches and crashes (each crash is a Spark
    start): the conformance suites kill the driver at every point."""
    result = subprocess.run(
        [sys.executable, "-m", "sparkeos.cli", "demo", "--workdir", str(tmp_path / "demo"),
         "--batches", "4", "--rows", "40", "--crashes", "2", "--seed", "7"],
        capture_output=True, text=True, timeout=900,
    )
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.fullmatch(
        r"exactly-once: verified input=160 output=160 duplicates=0 missing=0", lines[-1])
    table = [line.split() for line in lines if line.startswith(("plain", "sparkeos"))]
    rows = {cells[0]: cells for cells in table}
    assert int(rows["sparkeos"][2]) >= 2  # crashes
    assert int(rows["plain"][6]) > 0  # duplicates: the plain write wrote batches twice


@pytest.mark.chaos
@pytest.mark.connect
def test_demo_through_spark_connect(tmp_path):
    """``sparkeos demo --connect``: a crash, the queries through a local Spark Connect
    server (killed with the driver); the file sink's Connect suite kills at four points."""
    result = subprocess.run(
        [sys.executable, "-m", "sparkeos.cli", "demo", "--connect", "--workdir",
         str(tmp_path / "demo"), "--batches", "3", "--rows", "40", "--crashes", "1",
         "--seed", "11"],
        capture_output=True, text=True, timeout=900,
    )
    lines = result.stdout.strip().splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "through Spark Connect" in lines[0]
    assert re.fullmatch(
        r"exactly-once: verified input=120 output=120 duplicates=0 missing=0", lines[-1])
    table = [line.split() for line in lines if line.startswith(("plain", "sparkeos"))]
    rows = {cells[0]: cells for cells in table}
    assert int(rows["sparkeos"][2]) >= 1  # crashes
    assert int(rows["plain"][6]) > 0  # the plain write duplicated under the same crashes
