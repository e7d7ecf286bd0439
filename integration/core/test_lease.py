"""The running query's lease on its commit log, on real Spark: kept fresh through a batch
longer than its lifetime and through an idle spell, so ``sparkeos recover`` (without
``--force``) refuses all along; released when the query stops."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from integration.streams import id_stream
from sparkeos import exactly_once
from sparkeos.cli import check_lease
from sparkeos.connectors.file import FileSink
from sparkeos.core.errors import QueryRunningError
from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
from sparkeos.core.storage.logstores import open_store
from sparkeos.testing.job import (
    JobSpec,
    run_job_process,
    write_input,
)

TTL_S = 1.0
WAIT_S = 120.0


def wait_for(condition: Any, what: str) -> Any:
    """Poll ``condition`` until it returns something true (an event, not a fixed sleep;
    the deadline only bounds a failure)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting: {what}")


def renewed_after(log: CommitLog, moment: float) -> bool:
    lease = log.read_lease() or {}
    return float(lease.get("renewed", 0)) > moment


def assert_recover_refuses(log: CommitLog, moment: float, what: str) -> None:
    """More than one lifetime after ``moment`` the lease is still fresh: renewed since."""
    wait_for(lambda: renewed_after(log, moment + 1.5 * TTL_S),
             f"the lease renewed {1.5 * TTL_S:.1f} s after {what}")
    with pytest.raises(QueryRunningError, match="holds the lease"):
        check_lease("files", log)


def test_the_lease_lives_through_a_long_batch_and_an_idle_spell_then_is_released(
        spark: Any, tmp_path: Any) -> None:
    in_dir, ckpt = str(tmp_path / "in"), str(tmp_path / "ckpt")
    write_input(in_dir, [[1, 2]])
    log = CommitLog(open_store(sink_log_location(ckpt, "files")))
    adapter = exactly_once(FileSink(str(tmp_path / "out")), name="files", lease_ttl_s=TTL_S)
    in_batch, release, finished = threading.Event(), threading.Event(), threading.Event()

    def long_batch(df: Any, batch_id: int) -> None:
        adapter(df, batch_id)
        in_batch.set()
        release.wait(WAIT_S)  # the batch goes on for as long as the test says
        finished.set()

    query = (id_stream(spark, in_dir).writeStream.foreachBatch(long_batch)
             .option("checkpointLocation", ckpt).start())
    try:
        assert in_batch.wait(WAIT_S), "the first batch never ran"
        assert_recover_refuses(log, time.time(), "the batch began")
        release.set()
        assert finished.wait(WAIT_S)
        assert_recover_refuses(log, time.time(), "the query went idle")
    finally:
        release.set()
        query.stop()
    lease = wait_for(lambda: (log.read_lease() or {}).get("released") and log.read_lease(),
                     "the lease released once the query stopped")
    assert lease["query_id"] == str(query.id)
    check_lease("files", log)  # no longer held: recover may act


@pytest.mark.connect
def test_under_connect_the_server_side_process_keeps_the_lease(tmp_path: Any) -> None:
    """Under Spark Connect the batches run in a Python process of the server: the lease
    is kept from there while a batch outlasts it."""
    write_input(str(tmp_path / "input"), [[1, 2], [3]])
    signals = str(tmp_path / "signals")
    spec = JobSpec(input=str(tmp_path / "input"), checkpoint=str(tmp_path / "ckpt"),
                   sink={"factory": "integration.core.lease_job:held_batches",
                         "kwargs": {"out": str(tmp_path / "out"), "signals": signals,
                                    "checkpoint": str(tmp_path / "ckpt"),
                                    "lease_ttl_s": TTL_S}},
                   name="files", mode="function", connect=True)
    outcome: dict[str, Any] = {}
    job = threading.Thread(target=lambda: outcome.update(result=run_job_process(spec)))
    job.start()
    try:
        wait_for(lambda: os.path.exists(os.path.join(signals, "in-batch-0")),
                 "batch 0 in the server-side process")
        log = CommitLog(open_store(sink_log_location(spec.checkpoint, "files")))
        assert_recover_refuses(log, time.time(), "the batch began")
    finally:
        os.makedirs(signals, exist_ok=True)
        open(os.path.join(signals, "release"), "w").close()
        job.join(WAIT_S * 3)
    assert outcome["result"].returncode == 0, outcome["result"].tail()
