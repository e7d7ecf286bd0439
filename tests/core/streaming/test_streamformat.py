"""The format route's options and its protocol halves, in process (no Spark): what
``streamWriter()``, ``write()`` and ``commit()`` run, against a real file sink and a
checkpoint laid out as Spark lays it out."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from sparkeos.connectors.file import read_output
from sparkeos.connectors.file.format import JsonFormat, ParquetFormat
from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import CommitLogError, ConfigurationError, UnsupportedSparkError
from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
from sparkeos.core.storage.logstores import open_store
from sparkeos.core.streaming.formatbatch import (
    BATCH_ID_PROPERTY,
    FormatQuery,
    PlannedBatch,
    planned_batch,
    run_task,
)
from sparkeos.core.streaming.spark import QUERY_ID_PROPERTY
from sparkeos.core.streaming.streamformat import FormatSettings, Options, PreparedPartition
from sparkeos.testing.inprocess import ID_SCHEMA, id_batch

QUERY_ID = "3f0e2d1c-0000-4000-8000-000000000001"


def spark_checkpoint(root: Any) -> str:
    """A checkpoint as Spark leaves it once the query started: its metadata."""
    os.makedirs(root / "offsets", exist_ok=True)
    (root / "metadata").write_text(json.dumps({"id": QUERY_ID}) + "\n")
    return str(root)


def offsets_up_to(checkpoint: str, batch_id: int) -> None:
    """Spark writes ``offsets/<N>`` before it plans batch N."""
    with open(os.path.join(checkpoint, "offsets", str(batch_id)), "w") as fh:
        fh.write("v1\n{}\n")


def query(checkpoint: str, out: str, **settings: Any) -> FormatQuery:
    options = {"path": out, "checkpointLocation": checkpoint, "sparkeos.name": "files",
               **settings}
    fmt = ParquetFormat(options=options)
    sink, format_settings = fmt._sink_and_settings(ID_SCHEMA)
    return FormatQuery(sink, format_settings.config, format_settings.max_partitions)


def task(planned: PlannedBatch, partition: int, ids: list[int],
         batch_id: int | None = None) -> dict[str, Any]:
    props = {BATCH_ID_PROPERTY: str(planned.batch_id if batch_id is None else batch_id),
             QUERY_ID_PROPERTY: QUERY_ID}
    return run_task(planned, partition, 0, f"t{partition}", iter([id_batch(ids)]), props.get)


def ids_in(out: str) -> Counter[int]:
    table = read_output(out, "parquet")
    return Counter(table.column("id").to_pylist() if table.num_rows else [])


def staged(out: str) -> list[str]:
    return [n for n in os.listdir(os.path.join(out, ".sparkeos-staging")) if n[0] != "."]


def test_a_batch_planned_written_and_committed_in_three_processes(tmp_path: Any) -> None:
    checkpoint, out = spark_checkpoint(tmp_path / "ckpt"), str(tmp_path / "out")
    offsets_up_to(checkpoint, 0)
    planned = query(checkpoint, out).plan(ID_SCHEMA)
    assert (planned.batch_id, planned.run) == (0, 0)
    results = [task(planned, 0, [1, 2]), task(planned, 1, [3])]
    assert not ids_in(out), "nothing is visible before the decision"
    metrics = query(checkpoint, out).commit(0, results, ID_SCHEMA)
    assert (metrics.outcome, metrics.rows, metrics.partitions) == ("committed", 3, 2)
    assert ids_in(out) == Counter([1, 2, 3])
    state = CommitLog(open_store(sink_log_location(checkpoint, "files"))).batches()[0]
    assert state.finished is not None and state.begun[0]["partitions"] == 200


def test_streamwriter_plans_where_spark_makes_the_source_and_commits_where_it_ships_it(
        tmp_path: Any) -> None:
    """Spark's planner makes the data source from its class, its commit worker is sent
    the driver's instance pickled: ``streamWriter`` plans in the first and only there.
    A commit that planned again would begin another run of the batch being committed."""
    checkpoint, out = spark_checkpoint(tmp_path / "ckpt"), str(tmp_path / "out")
    options = {"path": out, "checkpointLocation": checkpoint, "sparkeos.name": "files"}
    spark_schema = StructType([StructField("id", LongType())])
    driver_made = ParquetFormat(options=options)
    offsets_up_to(checkpoint, 0)
    planning = ParquetFormat(options=options).streamWriter(spark_schema, False)
    assert planning.planned is not None and planning.planned.batch_id == 0
    shipped = pickle.loads(pickle.dumps(planning))  # to the tasks, with its plan
    assert shipped.planned is not None
    results = [PreparedPartition(task(shipped.planned, 0, [1, 2]))]
    committing = pickle.loads(pickle.dumps(driver_made)).streamWriter(spark_schema, False)
    assert committing.planned is None, "the commit worker must not plan"
    committing.commit(results, 0)
    assert ids_in(out) == Counter([1, 2])
    log = CommitLog(open_store(sink_log_location(checkpoint, "files")))
    state = log.batches()[0]
    assert (list(state.begun), state.decided_run) == ([0], 0), "one run of batch 0, decided"
    # Should a pyspark call the writer otherwise, nothing is shipped or committed:
    with pytest.raises(UnsupportedSparkError, match="planning from its commit"):
        pickle.dumps(committing)
    with pytest.raises(UnsupportedSparkError, match="planning from its commit"):
        planning.commit(results, 0)


def test_an_unproven_pyspark_is_refused_unless_asked(monkeypatch: Any, caplog: Any) -> None:
    import pyspark

    from sparkeos.core.streaming import sparkversion

    assert sparkversion.supported(pyspark.__version__), "the suite runs on a proven one"
    assert [sparkversion.supported(v) for v in ("4.0.5", "4.1.4", "4.2.1.dev1", "4.4.0",
                                                "5.0.0", "nightly")] == [
        False, False, True, False, False, False]
    monkeypatch.setattr(pyspark, "__version__", "4.0.5")
    monkeypatch.delenv(sparkversion.UNTESTED_ENV, raising=False)
    sparkversion.check_pyspark.cache_clear()
    try:
        with pytest.raises(UnsupportedSparkError, match=r"pyspark 4\.0\.5 is not one .*4\.2"):
            sparkversion.check_pyspark()
        sparkversion.check_pyspark.cache_clear()
        monkeypatch.setenv(sparkversion.UNTESTED_ENV, "1")
        assert sparkversion.check_pyspark() == "4.0.5"
        assert "running it anyway" in caplog.text
    finally:
        sparkversion.check_pyspark.cache_clear()


def test_a_crash_before_the_decision_is_rolled_back_and_written_again(tmp_path: Any) -> None:
    checkpoint, out = spark_checkpoint(tmp_path / "ckpt"), str(tmp_path / "out")
    offsets_up_to(checkpoint, 0)
    first = query(checkpoint, out).plan(ID_SCHEMA)
    task(first, 0, [1, 2])  # prepared; the driver dies before commit
    again = query(checkpoint, out).plan(ID_SCHEMA)  # the restart plans batch 0 again
    assert (again.batch_id, again.run) == (0, 1)
    query(checkpoint, out).commit(0, [task(again, 0, [1, 2])], ID_SCHEMA)
    assert ids_in(out) == Counter([1, 2])
    state = CommitLog(open_store(sink_log_location(checkpoint, "files"))).batches()[0]
    assert state.aborted == {0} and state.decided_run == 1
    assert staged(out) == [], "run 0 was swept"
    marks = [n for n in os.listdir(os.path.join(out, ".sparkeos-staging")) if n[0] == "."]
    assert len(marks) == 1, f"one shared-directory mark per driver process: {marks}"


def test_a_batch_decided_before_a_crash_is_finished_not_written_again(tmp_path: Any) -> None:
    checkpoint, out = spark_checkpoint(tmp_path / "ckpt"), str(tmp_path / "out")
    offsets_up_to(checkpoint, 0)
    planned = query(checkpoint, out).plan(ID_SCHEMA)
    results = [task(planned, 0, [1]), task(planned, 1, [2])]
    crashing = query(checkpoint, out)
    crashing.coordinator.scope.faults = crashing.faults = _crash_after_decided()
    with pytest.raises(BaseException, match="after_decided"):
        crashing.commit(0, results, ID_SCHEMA)
    assert not ids_in(out)
    replay = query(checkpoint, out).plan(ID_SCHEMA)  # the restart's planning commits it
    assert replay.run is None and replay.task is None
    assert ids_in(out) == Counter([1, 2])
    skipped = [task(replay, 0, [1]), task(replay, 1, [2])]
    assert all(r["rows"] == 0 for r in skipped)
    assert query(checkpoint, out).commit(0, skipped, ID_SCHEMA).outcome == "replayed"
    assert ids_in(out) == Counter([1, 2])


def test_a_move_to_at_least_once_over_an_unresolved_batch_is_refused(tmp_path: Any
                                                                    ) -> None:
    """An exactly-once run left batch 0 decided and not committed; the query restarts
    under at-least-once, which never opens the commit log: nothing would commit batch
    0, and once batch 1 is on record the replay rule would take that for batch 0's
    commit. Refused with the fix; after ``recover`` the switch goes on."""
    checkpoint, out = spark_checkpoint(tmp_path / "ckpt"), str(tmp_path / "out")
    offsets_up_to(checkpoint, 0)
    planned = query(checkpoint, out).plan(ID_SCHEMA)
    results = [task(planned, 0, [1]), task(planned, 1, [2])]
    crashing = query(checkpoint, out)
    crashing.coordinator.scope.faults = crashing.faults = _crash_after_decided()
    with pytest.raises(BaseException, match="after_decided"):
        crashing.commit(0, results, ID_SCHEMA)
    offsets_up_to(checkpoint, 1)
    weaker = {"sparkeos.guarantee": "at_least_once"}
    with pytest.raises(ConfigurationError, match=r"(?s)batch\(es\) \[0\].*sparkeos recover"):
        query(checkpoint, out, **weaker).plan(ID_SCHEMA)
    query(checkpoint, out).coordinator.recover(full=True)
    assert ids_in(out) == Counter([1, 2])
    query(checkpoint, out, **weaker).plan(ID_SCHEMA)


def test_abort_rolls_back_the_open_run(tmp_path: Any) -> None:
    checkpoint, out = spark_checkpoint(tmp_path / "ckpt"), str(tmp_path / "out")
    offsets_up_to(checkpoint, 0)
    planned = query(checkpoint, out).plan(ID_SCHEMA)
    result = task(planned, 0, [1])
    query(checkpoint, out).abort(0, [result, None])
    state = CommitLog(open_store(sink_log_location(checkpoint, "files"))).batches()[0]
    assert state.aborted == {0} and not state.open_runs
    assert staged(out) == []
    with pytest.raises(Exception, match="aborted"):
        query(checkpoint, out).commit(0, [result], ID_SCHEMA)
    assert not ids_in(out)


def test_a_task_of_another_batch_or_above_the_bound_refuses(tmp_path: Any) -> None:
    checkpoint, out = spark_checkpoint(tmp_path / "ckpt"), str(tmp_path / "out")
    offsets_up_to(checkpoint, 0)
    offsets_up_to(checkpoint, 1)
    planned = query(checkpoint, out, **{"sparkeos.maxPartitions": "2"}).plan(ID_SCHEMA)
    assert planned.batch_id == 1 == planned_batch(checkpoint)
    with pytest.raises(CommitLogError, match="ran with the plan of batch 1"):
        task(planned, 0, [1], batch_id=2)
    with pytest.raises(ConfigurationError, match=r"sparkeos\.maxPartitions"):
        task(planned, 2, [1])
    assert not ids_in(out)


def test_at_least_once_tasks_commit_under_their_own_batch(tmp_path: Any) -> None:
    out = str(tmp_path / "out")
    direct = query("", out, **{"sparkeos.guarantee": "at_least_once",
                               "checkpointLocation": ""})
    planned = direct.plan(ID_SCHEMA)  # no checkpoint: nothing to plan from
    assert planned.run is None
    task(planned, 0, [1, 2], batch_id=7)
    task(planned, 1, [3], batch_id=7)
    assert ids_in(out) == Counter([1, 2, 3]), "each task committed its own rows"
    assert direct.commit(7, [], ID_SCHEMA).outcome == "direct"


def test_options(tmp_path: Any) -> None:
    base = {"path": str(tmp_path / "out"), "checkpointLocation": str(tmp_path / "c")}
    with pytest.raises(ConfigurationError, match=r"does not know the option.*compresion"):
        ParquetFormat(options={**base, "compresion": "zstd"})._sink_and_settings(ID_SCHEMA)
    with pytest.raises(ConfigurationError, match="needs the query's checkpointLocation"):
        ParquetFormat(options={"path": base["path"]})._sink_and_settings(ID_SCHEMA)
    with pytest.raises(ConfigurationError, match="needs the option 'path'"):
        ParquetFormat(options={"checkpointLocation": "c"})._sink_and_settings(ID_SCHEMA)
    with pytest.raises(ConfigurationError, match="partitionBy"):
        partitioned = {**base, "__partition_columns": '["day"]'}
        ParquetFormat(options=partitioned)._sink_and_settings(ID_SCHEMA)
    with pytest.raises(ConfigurationError, match="uncompressed"):
        JsonFormat(options={**base, "compression": "gzip"})._sink_and_settings(ID_SCHEMA)
    with pytest.raises(ConfigurationError, match="complete mode"):
        ParquetFormat(options=base).streamWriter(StructType([StructField("id", LongType())]),
                                                 True)
    sink, settings = ParquetFormat(options={
        **base, "sparkeos.guarantee": "at_least_once", "sparkeos.taskattempts": "4",
        "sparkeos.maxpartitions": "16", "compression": "zstd"})._sink_and_settings(ID_SCHEMA)
    assert settings.config.guarantee is Guarantee.AT_LEAST_ONCE
    assert (settings.config.task_attempts, settings.max_partitions) == (4, 16)
    assert sink.compression == "zstd" and settings.config.name == "sink"
    options = Options({"sparkeos.maxPartitions": "many"}, "sparkeos-parquet")
    with pytest.raises(ConfigurationError, match="not a whole number"):
        FormatSettings.read(options)
    options = Options({"sparkeos.leaseTtlSeconds": "soon", **base}, "sparkeos-parquet")
    with pytest.raises(ConfigurationError, match="not a number"):
        FormatSettings.read(options)
    assert CoordinatorConfig(name="sink").guarantee is Guarantee.EXACTLY_ONCE


def _crash_after_decided() -> Any:
    from sparkeos.core.faults import FaultPlan

    return FaultPlan("after_decided", 0, simulate=True)


def test_every_format_is_registered_by_spark_itself() -> None:
    """Spark registers each installed top-level ``pyspark_*`` module's ``DefaultSource``:
    one module per format, each in the wheel (pyproject's py-modules)."""
    import importlib
    from pathlib import Path

    import tomllib

    from sparkeos.formats import format_classes

    root = Path(__file__).resolve().parents[3]
    modules = sorted(p.stem for p in (root / "plugins").glob("pyspark_*.py"))
    shipped = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert sorted(shipped["py-modules"]) == modules
    sources = {m: importlib.import_module(m).DefaultSource for m in modules}
    assert set(sources.values()) == set(format_classes())
    for module, source in sources.items():
        assert module == "pyspark_" + source.name().replace("-", "_")


HEAVY_IMPORTS = ("pyarrow", "numpy", "pandas", "deltalake", "pyiceberg", "confluent_kafka",
                 "psycopg2", "sqlalchemy", "stomp", "boto3")


def test_the_plugin_modules_import_no_library_of_a_sink() -> None:
    """Spark imports every installed ``pyspark_*`` module in a fresh Python process at
    each format query's lookup and its data source's creation, where only the class is
    needed (sparkeos.core.lazy): a sink's libraries imported there cost every format
    query about 0.9 s (measured when two connectors' packages imported their sinks)."""
    root = Path(__file__).resolve().parents[3]
    modules = sorted(p.stem for p in (root / "plugins").glob("pyspark_*.py"))
    probe = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
             f"print(sorted(n for n in {HEAVY_IMPORTS!r} if n in sys.modules))")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONPATH": str(root / "plugins")})
    assert found.stdout.strip() == "[]", found.stdout + found.stderr


def test_a_batch_holds_the_lease_from_its_planning_until_its_commit(tmp_path: Any) -> None:
    """The format route has no process that lives as long as the query run: the lease
    is taken at the planning (before ``begun``), names the driver (not a worker), and is
    released once the batch is committed or aborted."""
    from sparkeos.core.snapshot.lease import lease_held

    checkpoint, out = spark_checkpoint(tmp_path / "ckpt"), str(tmp_path / "out")
    log = CommitLog(open_store(sink_log_location(checkpoint, "files")))
    offsets_up_to(checkpoint, 0)
    planned = query(checkpoint, out).plan(ID_SCHEMA)
    lease = log.read_lease()
    assert lease_held(lease) and lease["batch"] == 0 and lease["pid"] != os.getpid()
    assert planned.lease is not None and planned.lease.record["pid"] == lease["pid"]
    query(checkpoint, out).commit(0, [task(planned, 0, [1])], ID_SCHEMA)
    assert not lease_held(log.read_lease()), "still held after the batch committed"
    offsets_up_to(checkpoint, 1)
    query(checkpoint, out).plan(ID_SCHEMA)
    assert lease_held(log.read_lease())
    query(checkpoint, out).abort(1, [None])
    assert log.read_lease()["released"] and log.read_lease()["batch"] == 1


def test_a_batch_of_many_partitions_is_warned_about_once(caplog):
    """Spark's Python writer costs a task per partition: the route says how to merge
    them, once per sink."""
    import logging

    from sparkeos.core.streaming import formatbatch

    fields = {"query": "q", "sink": "many-partitions-sink", "batch": 3}
    with caplog.at_level(logging.WARNING, logger="sparkeos"):
        formatbatch.warn_many_partitions(fields, formatbatch.MANY_PARTITIONS)
        assert not caplog.records
        formatbatch.warn_many_partitions(fields, 200)
        formatbatch.warn_many_partitions({**fields, "batch": 4}, 200)
    warned = [r for r in caplog.records if "format.many_partitions" in r.getMessage()]
    assert len(warned) == 1 and "coalesce" in warned[0].getMessage()
    assert warned[0].sparkeos["partitions"] == 200
