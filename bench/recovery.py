"""Benchmark: how long recovery of a decided batch takes after the driver died.

A streaming job (its own driver process, ``sparkeos.testing.job``) writes
``--batches`` micro-batches of ``--rows-per-batch`` rows through
``exactly_once(<sink>)``. Its driver is killed (``os._exit``) right after the decision
of batch ``--kill-at`` was recorded, before any commit. The job is started again from
the same checkpoint: Spark re-runs that batch, and the adapter finishes its commits
before anything else (``BatchMetrics.recovered``). Reported:

* ``restart to first batch``: from the new driver process's start to its first batch
  (JVM, SparkSession, the query's start: Spark's cost, the same for any sink);
* ``recovery of the decided batch: <ms>``: from the restarted query's first batch start
  until the decided batch is committed (``BatchMetrics.recover_ms``): sparkeos's cost;
* the output is then counted: every id exactly once, or the exit status is 1.

Sinks: ``--sink file`` (default, no service), ``postgres`` (the local server of
``docker/services/postgres.sh`` or ``$SPARKEOS_POSTGRES_DSN``), ``kafka`` (the broker
of ``docker/services/kafka.sh`` or ``$SPARKEOS_KAFKA_BOOTSTRAP``).

    ./run bench recovery --sink postgres
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any

from _services import service  # bench/ is the script's directory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sink_spec(kind: str, work: str, run: str) -> tuple[dict[str, Any], Any]:
    """(the job's sink factory and kwargs, a function counting (rows, distinct ids))."""
    if kind == "file":
        out = os.path.join(work, "out")

        def count_files() -> tuple[int, int]:
            from sparkeos.connectors.file import read_output

            ids = read_output(out).column("id").to_pylist()
            return len(ids), len(set(ids))

        return {"factory": "sparkeos.connectors.file:FileSink", "kwargs": {"path": out}}, \
            count_files
    if kind == "postgres":
        dsn = service("postgres.sh", "SPARKEOS_POSTGRES_DSN", "dsn")
        table = f"bench_recovery_{run}"

        def count_table() -> tuple[int, int]:
            import psycopg2

            with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                cur.execute(f'SELECT count(*), count(DISTINCT id) FROM "{table}"')
                rows, distinct = cur.fetchone()
                cur.execute(f'DROP TABLE "{table}"')
            conn.close()
            return int(rows), int(distinct)

        return {"factory": "sparkeos.connectors.jdbc:PostgresSink",
                "kwargs": {"dsn": dsn, "table": table, "create_table": True}}, count_table
    bootstrap = service("kafka.sh", "SPARKEOS_KAFKA_BOOTSTRAP", "bootstrap")
    topic = f"bench-recovery-{run}"
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)

    def count_topic() -> tuple[int, int]:
        from sparkeos.connectors.kafka import read_topic

        ids = [json.loads(r.value())["id"] for r in read_topic(bootstrap, topic)]
        admin.delete_topics([topic])
        return len(ids), len(set(ids))

    return {"factory": "sparkeos.connectors.kafka:KafkaSink",
            "kwargs": {"bootstrap_servers": bootstrap, "topic": topic,
                       "staging_dir": os.path.join(work, "staging")}}, count_topic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sink", choices=("file", "postgres", "kafka"), default="file")
    parser.add_argument("--rows-per-batch", type=int, default=50_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--kill-at", type=int, default=2)
    args = parser.parse_args(argv)
    if not 0 <= args.kill_at < args.batches:
        parser.error("--kill-at must name one of the batches")

    from sparkeos.testing.job import JobSpec, run_job_process, write_input

    work = tempfile.mkdtemp(prefix="sparkeos-bench-recovery-")
    try:
        n = args.rows_per_batch
        expected = len(write_input(os.path.join(work, "in"),
                                   [range(b * n, (b + 1) * n) for b in range(args.batches)]))
        sink, count = sink_spec(args.sink, work, uuid.uuid4().hex[:8])
        metrics_file = os.path.join(work, "metrics.json")
        spec = JobSpec(input=os.path.join(work, "in"), checkpoint=os.path.join(work, "ckpt"),
                       sink=sink, name="recovery", metrics_file=metrics_file)
        first = run_job_process(spec, fault=f"after_decided@{args.kill_at}", timeout=600)
        if not first.crashed:
            print(f"FAIL: the first run was not killed:\n{first.tail()}", file=sys.stderr)
            return 1
        started = time.time()
        second = run_job_process(spec, timeout=600)
        if second.returncode != 0:
            print(f"FAIL: the restarted run failed:\n{second.tail()}", file=sys.stderr)
            return 1
        with open(metrics_file) as fh:
            metrics = json.load(fh)
        recovering = metrics[0]
        recovered = [r["batch_id"] for r in recovering["recovered"]]
        if recovered != [args.kill_at]:
            print(f"FAIL: the restart recovered batches {recovered}, not [{args.kill_at}]",
                  file=sys.stderr)
            return 1
        rows, distinct = count()
        print(f"sink {args.sink}: {args.batches} batches x {n} rows, driver killed after "
              f"batch {args.kill_at} was decided")
        print(f"restarted run: {time.time() - started:.1f} s for the whole run "
              "(JVM and query start included)")
        print(f"output: {rows} rows, {distinct} distinct ids, input {expected}")
        print(f"recovery of the decided batch: {recovering['recover_ms']:.0f} ms "
              f"(sink {args.sink}, after the restarted query's first batch started)")
        return 0 if rows == distinct == expected else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
