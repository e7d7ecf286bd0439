"""A query that ends, ends committed (``overlap_commits``, ``core.streaming.ending``): each way
to end a query waits for the commit of its last batch, which Kafka's staged sink runs
in Spark tasks on a driver thread, or raises its failure.

``query.stop()`` and ``awaitTermination()`` run in this process's Spark session; ends of
the session and of the interpreter run in a job process (``query_end_job``). Each test
checks the moment the end returns (the job's report) and Kafka (``read_committed``)
afterwards."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from integration.core.query_end_job import log_statuses, run_query
from integration.fixtures.kafka import ROOT, create_topic, unique_name
from sparkeos.connectors.kafka import read_topic
from sparkeos.testing.conformance import assert_exactly_once
from sparkeos.testing.job import JobResult, run_spec_process

ROWS = 100
"""Rows per input file; one file per batch: two batches per query."""
BIG_ID = 2 * ROWS - 1
TOO_LARGE = {"max.message.bytes": "20000"}
"""A topic that refuses a record of ``BIG_ID``'s payload (50 kB) at produce time, which
is phase 2: the batch that holds it is decided, and its commit fails."""
ALL_FINISHED = {"0": "finished", "1": "finished"}


def make_query(bootstrap: str, work: str, index: int, end: str,
               refused: bool = False) -> dict[str, Any]:
    """A query's spec for ``query_end_job``: its topic and two input files, the last
    row of the second one too large for the topic when ``refused``."""
    topic = unique_name(work)
    create_topic(bootstrap, topic, 2, TOO_LARGE if refused else None)
    folder = os.path.join(work, f"input-{index}")
    os.makedirs(folder)
    for batch in range(2):
        path = os.path.join(folder, f"input-{batch}.json")
        with open(path, "w") as fh:
            for i in range(batch * ROWS, (batch + 1) * ROWS):
                payload = "x" * 50_000 if refused and i == BIG_ID else f"row-{i}"
                fh.write(json.dumps({"id": i, "payload": payload}) + "\n")
        # Distinct modification times keep the file source's order stable.
        os.utime(path, (1_700_000_000 + batch, 1_700_000_000 + batch))
    return {"topic": topic, "input": folder, "end": end}


def visible(bootstrap: str, topic: str) -> list[int]:
    return [int(json.loads(m.value())["id"]) for m in read_topic(bootstrap, topic)]


def run_in_job(bootstrap: str, work: str, queries: list[dict[str, Any]]
            ) -> tuple[JobResult, list[dict[str, Any]]]:
    """Run the queries in one job process; its result and its reports."""
    result = run_spec_process("integration.core.query_end_job",
                              {"bootstrap": bootstrap, "work": work, "queries": queries},
                              os.path.join(work, "spec.json"), cwd=ROOT,
                              ahead_settings={})
    path = os.path.join(work, "report.jsonl")
    reports = []
    if os.path.exists(path):
        with open(path) as fh:
            reports = [json.loads(line) for line in fh]
    return result, reports


@pytest.mark.parametrize("end", ["query_stop", "await", "processed"])
def test_a_query_end_returns_once_its_last_batch_is_committed(
        spark: Any, kafka_bootstrap: str, tmp_path: Any, end: str) -> None:
    """``query.stop()`` once the input is processed, ``awaitTermination()`` of an
    ``availableNow`` query, ``processAllAvailable()`` of a running one: when the call
    returns, every batch is finished and every record visible."""
    work = str(tmp_path)
    query = make_query(kafka_bootstrap, work, 0, end)
    report = run_query(spark, kafka_bootstrap, work, 0, query)
    assert report["raised"] is None, report
    assert report["statuses"] == ALL_FINISHED, report
    assert_exactly_once(visible(kafka_bootstrap, query["topic"]), list(range(2 * ROWS)))


def test_spark_stop_commits_the_last_batch_before_the_context_stops(
        kafka_bootstrap: str, tmp_path: Any) -> None:
    """``spark.stop()`` with the query active and its last batch committing: the
    commit ends in Spark tasks first, and the script ends without an error."""
    work = str(tmp_path)
    query = make_query(kafka_bootstrap, work, 0, "spark_stop")
    result, reports = run_in_job(kafka_bootstrap, work, [query])
    assert result.returncode == 0, result.tail()
    assert [r["raised"] for r in reports] == [None], reports
    assert reports[0]["statuses"] == ALL_FINISHED, reports
    assert_exactly_once(visible(kafka_bootstrap, query["topic"]), list(range(2 * ROWS)))


def test_a_commit_whose_context_stopped_finishes_in_the_driver_process(
        kafka_bootstrap: str, tmp_path: Any) -> None:
    """Spark's context stops in the JVM (behind pyspark, as an application's end does)
    between the last batch's phase 1 and its decision: its commit cannot run in Spark
    tasks, so it runs in the driver's process (as ``sparkeos recover`` commits), and the
    interpreter's exit waits for it. (The query itself fails: Spark cannot go on.)"""
    work = str(tmp_path)
    query = make_query(kafka_bootstrap, work, 0, "context_lost")
    result, reports = run_in_job(kafka_bootstrap, work, [query])
    assert result.returncode == 0, result.tail()
    assert len(reports) == 1, result.tail()  # the job went on past the query's end
    assert log_statuses(os.path.join(work, "checkpoint-0")) == ALL_FINISHED
    assert_exactly_once(visible(kafka_bootstrap, query["topic"]), list(range(2 * ROWS)))


def test_a_failed_last_commit_is_raised_or_fails_the_exit(
        kafka_bootstrap: str, tmp_path: Any) -> None:
    """The last batch's commit fails (Kafka refuses a record at produce time):
    ``awaitTermination()`` raises it. Two queries then stay active to the script's end,
    their last batches committing: the interpreter's exit finishes the one that can
    commit, and exits with status 1 for the one that cannot, saying why. Every batch
    that failed stays decided, for the next run to commit."""
    work = str(tmp_path)
    queries = [make_query(kafka_bootstrap, work, 0, "await", refused=True),
               make_query(kafka_bootstrap, work, 1, "exit"),
               make_query(kafka_bootstrap, work, 2, "exit", refused=True)]
    result, reports = run_in_job(kafka_bootstrap, work, queries)
    raised = reports[0]["raised"]
    assert raised is not None and "MSG_SIZE_TOO_LARGE" in raised["message"], reports
    assert raised["message"].startswith("[sink=ends batch=1]"), raised
    assert result.returncode == 1, result.tail()
    assert "the background commit of sink 'ends' failed" in result.stderr, result.tail()
    assert "query.end_failed" in result.stderr, result.tail()
    assert_exactly_once(visible(kafka_bootstrap, queries[1]["topic"]), list(range(2 * ROWS)))
    assert log_statuses(os.path.join(work, "checkpoint-1")) == ALL_FINISHED
    for index in (0, 2):
        assert log_statuses(os.path.join(work, f"checkpoint-{index}")) == {
            "0": "finished", "1": "decided"}, f"query {index}: batch 1 not left decided"
