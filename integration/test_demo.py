"""The demo users run first: it must end with the verified line after real crashes."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from sparkeos.core.storage.registry import split_uri


def run_demo(tmp_path, *args):
    """``sparkeos demo`` in a process of its own: its result and output lines; it must
    exit 0."""
    result = subprocess.run(
        [sys.executable, "-m", "sparkeos.cli", "demo", "--workdir", str(tmp_path / "demo"),
         *args], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    return result, result.stdout.strip().splitlines()


@pytest.mark.chaos
def test_demo_verifies_exactly_once_after_two_crashes(tmp_path):
    """The demo as users run it, with fewer batches and crashes (each crash is a Spark
    start): the conformance suites kill the driver at every point."""
    _, lines = run_demo(tmp_path, "--batches", "4", "--rows", "40", "--crashes", "2",
                        "--seed", "7")
    assert re.fullmatch(
        r"exactly-once: verified input=160 output=160 duplicates=0 missing=0", lines[-1])
    table = [line.split() for line in lines if line.startswith(("plain", "sparkeos"))]
    rows = {cells[0]: cells for cells in table}
    assert int(rows["sparkeos"][2]) >= 2  # crashes
    assert int(rows["plain"][6]) > 0  # duplicates: the plain write wrote batches twice


@pytest.mark.chaos
def test_demo_through_the_format(tmp_path):
    """``sparkeos demo --format``: the exactly-once query writes through
    ``writeStream.format("sparkeos-parquet")``, killed at a protocol point (the plain
    comparison is the first test's; every point runs in the format's suite, in process)."""
    _, lines = run_demo(tmp_path, "--format", "--batches", "2", "--rows", "40",
                        "--crashes", "1", "--seed", "3", "--skip-plain")
    assert 'writeStream.format("sparkeos-parquet")' in "\n".join(lines)
    assert re.fullmatch(
        r"exactly-once: verified input=80 output=80 duplicates=0 missing=0", lines[-1])
    rows = {line.split()[0]: line.split() for line in lines if line.startswith("sparkeos ")}
    assert int(rows["sparkeos"][2]) >= 1  # crashes


@pytest.mark.chaos
@pytest.mark.connect
def test_demo_through_spark_connect(tmp_path):
    """``sparkeos demo --connect``: a crash, the query through a local Spark Connect
    server (killed with the driver); the file sink's Connect suite kills at two points,
    and the plain write's duplicates are the classic demo's to show."""
    _, lines = run_demo(tmp_path, "--connect", "--batches", "2", "--rows", "40",
                        "--crashes", "1", "--seed", "11", "--skip-plain")
    assert "through Spark Connect" in lines[0]
    assert re.fullmatch(
        r"exactly-once: verified input=80 output=80 duplicates=0 missing=0", lines[-1])
    table = [line.split() for line in lines if line.startswith(("plain", "sparkeos"))]
    rows = {cells[0]: cells for cells in table}
    assert int(rows["sparkeos"][2]) >= 1  # crashes
    assert "plain" not in rows


@pytest.mark.chaos
@pytest.mark.s3
def test_demo_on_the_local_object_store_through_wire_faults(tmp_path, s3):
    """``sparkeos demo --store s3 --wire-faults``: checkpoint (Spark's through S3A, the
    commit log), staging and output on the checkout's local S3-compatible store, a
    driver kill, and sparkeos' requests through a proxy that loses replies of applied
    writes and answers 503 SlowDown (issue 37)."""
    result, lines = run_demo(tmp_path, "--store", "s3", "--wire-faults", "--batches", "3",
                             "--rows", "40", "--crashes", "1", "--seed", "5", "--skip-plain")
    assert "outputs and checkpoints in s3a://sparkeos-demo/sparkeos-demo" in lines[0]
    faults = re.search(r"wire faults: (\d+) replies lost .*, (\d+) answered 503", result.stdout)
    assert faults and int(faults.group(1)) > 0, result.stdout
    assert re.fullmatch(
        r"exactly-once: verified input=120 output=120 duplicates=0 missing=0", lines[-1])
    assert "sparkeos status s3a://sparkeos-demo/sparkeos-demo/checkpoint-exactly_once" in (
        result.stdout)


@pytest.mark.chaos
@pytest.mark.clouds
@pytest.mark.parametrize("store,uri", [
    ("gs", "gs://sparkeos-demo/sparkeos-demo"),
    ("abfs", "abfs://sparkeos-demo@devstoreaccount1.dfs.core.windows.net/sparkeos-demo")])
def test_demo_on_the_gcs_and_azure_emulators(tmp_path, store, uri, request):
    """``sparkeos demo --store gs|abfs``: the commit log and the output on the local
    emulator (fake-gcs-server, Azurite), a driver kill. On GCS Spark's checkpoint is
    there too (Google's connector for Hadoop); on Azurite, which has no endpoint
    hadoop-azure reaches, it is in the workdir."""
    request.getfixturevalue("gcs" if store == "gs" else "azure")  # the session's emulator
    result, lines = run_demo(tmp_path, "--store", store, "--batches", "2", "--rows", "40",
                             "--crashes", "1", "--seed", "5", "--skip-plain")
    assert f"outputs and checkpoints in {uri}" in lines[0]
    assert result.stdout.count("driver killed") == 1, result.stdout
    assert re.fullmatch(
        r"exactly-once: verified input=80 output=80 duplicates=0 missing=0", lines[-1])
    assert f"sparkeos status {uri}/checkpoint-exactly_once" in result.stdout
    files, path = split_uri(f"{uri}/checkpoint-exactly_once")
    on_the_store = {"sparkeos", "offsets", "commits"} if store == "gs" else {"sparkeos"}
    assert on_the_store <= set(files.listdir(path)), files.listdir(path)
