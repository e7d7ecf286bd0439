"""Benchmark: the exactly-once PostgreSQL sink against the at-least-once ways users write today.

In one run, on one SparkSession and one PostgreSQL, the same streaming input (one
Parquet file per micro-batch, ``maxFilesPerTrigger=1``, ``availableNow``) is written by:

* ``exactly_once``  ``exactly_once(PostgresSink(...))``: COPY + PREPARE TRANSACTION per
                    writer (at most the executors' cores: the batch is coalesced),
                    COMMIT PREPARED on the driver after the durable decision (in a
                    classic session, beside the next batch);
* ``format``        ``writeStream.format("sparkeos-postgres")``: the same sink, one
                    prepared transaction per Spark partition (the route cannot
                    coalesce), committed before Spark sees the batch end;
* ``upsert``        ``at_least_once(PostgresSink(mode="upsert", key=["id"]))``;
* ``copy``          ``at_least_once(PostgresSink(...))``: binary COPY from Arrow and a
                    plain COMMIT in each task, the fastest plain write we know;
* ``copy_csv``      ``foreachBatch`` + ``foreachPartition`` with a hand-written CSV
                    ``COPY ... FROM STDIN`` (psycopg2 ``copy_expert``) per task;
* ``plain``         ``foreachBatch`` + ``foreachPartition`` inserting with psycopg2
                    ``execute_values`` (at-least-once);
* ``spark_jdbc``    ``foreachBatch`` + ``df.write.jdbc(...)`` (PostgreSQL JDBC driver
                    from Maven Central), Spark's own at-least-once path.

Modes run in rotating order for ``--repeats`` rounds; medians are reported. Every run
is checked: the table holds exactly the input's ids. ``--partitions N`` repartitions
the source in every mode. The last line is ``ratio exactly_once/plain: <x>``: median
wall time of exactly-once / that of the fastest plain (at-least-once) mode that ran
(``ratio format/plain`` before it, for the format). The format at N partitions holds N
prepared transactions per batch: PostgreSQL needs ``max_prepared_transactions`` >= N
(a server the bench starts has 512, or ``SPARKEOS_PG_MAX_PREPARED``).

    ./run bench jdbc_sink --rows-per-batch 100000 --batches 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from _services import service  # bench/ is the script's directory
from _split import adapter_split

REPO = Path(__file__).resolve().parents[1]
MODES = ("exactly_once", "format", "upsert", "copy", "copy_csv", "plain", "spark_jdbc")
PLAIN_MODES = ("copy", "copy_csv", "plain", "spark_jdbc")
SINK_METRICS: dict[str, list[Any]] = {}
ADD_BATCH: dict[str, list[list[float]]] = {}
JDBC_DRIVER = "org.postgresql:postgresql:42.7.5"
SCHEMA_DDL = "id long, payload string, value double"


def pg_dsn() -> str:
    # Room for the format's prepared transactions at 200 partitions (a server already
    # running keeps its own setting; the sink's preflight says if it is too small).
    env = {**os.environ, "SPARKEOS_PG_MAX_PREPARED":
           os.environ.get("SPARKEOS_PG_MAX_PREPARED", "512")}
    return service("postgres.sh", "SPARKEOS_POSTGRES_DSN", "dsn", env)


def jdbc_jar() -> str:
    return subprocess.run(["bash", str(REPO / "docker/services/jars.sh"), JDBC_DRIVER],
                          check=True, capture_output=True, text=True).stdout.strip()


def generate_input(directory: str, batches: int, rows: int) -> int:
    os.makedirs(directory, exist_ok=True)
    now = time.time() - batches - 10
    for b in range(batches):
        ids = range(b * rows, (b + 1) * rows)
        table = pa.table({
            "id": pa.array(ids, pa.int64()),
            "payload": pa.array([f"{i:012d}:" + "x" * (50 + i % 40) for i in ids]),
            "value": pa.array([i * 0.5 for i in ids], pa.float64()),
        })
        path = os.path.join(directory, f"batch-{b:05d}.parquet")
        pq.write_table(table, path, row_group_size=max(1, rows // 8))
        os.utime(path, (now + b, now + b))
    return batches * rows


def plain_writer(dsn: str, table: str) -> Callable[[Any, int], None]:
    def write(df: Any, batch_id: int) -> None:
        def insert(rows: Iterator[Any]) -> None:
            import psycopg2
            from psycopg2.extras import execute_values

            with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                execute_values(cur, f'INSERT INTO "{table}" (id, payload, value) VALUES %s',
                               [tuple(r) for r in rows], page_size=2000)

        df.foreachPartition(insert)

    return write


def copy_csv_writer(dsn: str, table: str) -> Callable[[Any, int], None]:
    def write(df: Any, batch_id: int) -> None:
        def copy(rows: Iterator[Any]) -> None:
            import csv
            import io

            import psycopg2

            buffer = io.StringIO()
            csv.writer(buffer).writerows(tuple(r) for r in rows)
            buffer.seek(0)
            with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                cur.copy_expert(f'COPY "{table}" (id, payload, value) FROM STDIN '
                                "WITH (FORMAT csv)", buffer)

        df.foreachPartition(copy)

    return write


def spark_jdbc_writer(dsn: str, table: str) -> Callable[[Any, int], None]:
    from psycopg2.extensions import parse_dsn

    parts = parse_dsn(dsn)
    url = f"jdbc:postgresql://{parts.get('host', '127.0.0.1')}:{parts.get('port', '5432')}/" \
          f"{parts.get('dbname', 'postgres')}"
    props = {"user": parts.get("user", "postgres"), "driver": "org.postgresql.Driver",
             "batchsize": "5000"}
    if "password" in parts:
        props["password"] = parts["password"]

    def write(df: Any, batch_id: int) -> None:
        df.write.jdbc(url, f'"{table}"', mode="append", properties=props)

    return write


def dsn_uri(dsn: str) -> str:
    """``dsn`` as the ``postgresql://`` URI the format's ``url`` option takes."""
    from urllib.parse import quote

    from psycopg2.extensions import parse_dsn

    parts = parse_dsn(dsn)
    auth = quote(parts.get("user", "postgres"), safe="")
    if "password" in parts:
        auth += ":" + quote(parts["password"], safe="")
    return (f"postgresql://{auth}@{parts.get('host', '127.0.0.1')}:"
            f"{parts.get('port', '5432')}/{parts.get('dbname', 'postgres')}")


def reset_table(dsn: str, table: str, with_key: bool) -> None:
    import psycopg2

    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f'DROP TABLE IF EXISTS "{table}"')
        key = " PRIMARY KEY" if with_key else ""
        cur.execute(f'CREATE TABLE "{table}" (id bigint{key}, payload text, '
                    "value double precision)")


def table_ids(dsn: str, table: str) -> tuple[int, int]:
    import psycopg2

    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f'SELECT count(*), count(DISTINCT id) FROM "{table}"')
        total, distinct = cur.fetchone()
        return int(total), int(distinct)


def run_mode(spark: Any, mode: str, dsn: str, input_dir: str, work: str, run: int,
             partitions: int = 0) -> float:
    from sparkeos import at_least_once, exactly_once
    from sparkeos.connectors.jdbc import PostgresSink

    table = f"bench_{mode}"
    reset_table(dsn, table, with_key=(mode == "upsert"))
    if mode == "exactly_once":
        fn: Any = exactly_once(PostgresSink(dsn=dsn, table=table, marker_table="bench_markers"),
                               name=f"bench-{mode}")
    elif mode == "upsert":
        fn = at_least_once(PostgresSink(dsn=dsn, table=table, mode="upsert", key=["id"]),
                           name=f"bench-{mode}")
    elif mode == "copy":
        fn = at_least_once(PostgresSink(dsn=dsn, table=table), name=f"bench-{mode}")
    elif mode == "format":
        fn = None
    elif mode == "copy_csv":
        fn = copy_csv_writer(dsn, table)
    elif mode == "plain":
        fn = plain_writer(dsn, table)
    else:
        fn = spark_jdbc_writer(dsn, table)
    df = (spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1)
          .parquet(input_dir))
    if partitions:
        df = df.repartition(partitions)
    started = time.perf_counter()
    if fn is None:
        writer = (df.writeStream.format("sparkeos-postgres").option("url", dsn_uri(dsn))
                  .option("dbtable", table).option("sparkeos.markerTable", "bench_markers")
                  .option("sparkeos.name", f"bench-{mode}"))
    else:
        writer = df.writeStream.foreachBatch(fn)
    query = (writer.option("checkpointLocation", os.path.join(work, f"ckpt-{mode}-{run}"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.perf_counter() - started
    if run >= 0:
        ADD_BATCH.setdefault(mode, []).append(
            [float(p.durationMs.get("addBatch", 0)) for p in query.recentProgress
             if p.numInputRows])
    if run >= 0 and hasattr(fn, "metrics"):
        SINK_METRICS.setdefault(mode, []).extend(
            m for m in fn.metrics if m.rows)
    return seconds


def print_breakdown() -> None:
    """Spark's addBatch (first batch of a run, then the rest) and the sparkeos
    adapter's own split of each batch, medians."""
    print("per-batch medians (ms):")
    for mode, runs in ADD_BATCH.items():
        first = statistics.median([r[0] for r in runs if r])
        rest = [v for r in runs for v in r[1:]]
        print(f"  {mode:<13} addBatch: first batch {first:.0f}, later batches "
              f"{statistics.median(rest) if rest else 0:.0f}")
    for mode, metrics in SINK_METRICS.items():
        print(f"  {mode:<13} per batch (ms): {adapter_split(metrics)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows-per-batch", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--partitions", type=int, default=0,
                        help="repartition(n) the source in every mode (0: the source's own)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]

    from sparkeos.core.streaming.spark import local_session

    dsn = pg_dsn()
    conf = {"spark.jars": jdbc_jar()} if "spark_jdbc" in modes else {}
    spark = local_session("sparkeos-bench-jdbc", conf=conf)
    work = tempfile.mkdtemp(prefix="sparkeos-bench-jdbc-")
    input_dir = os.path.join(work, "input")
    total = generate_input(input_dir, args.batches, args.rows_per_batch)
    warm = os.path.join(work, "warm")
    generate_input(warm, 1, args.rows_per_batch)
    for mode in modes:  # warm up Spark (the same plan, at full size), workers, connections
        run_mode(spark, mode, dsn, warm, work, -1, args.partitions)

    times: dict[str, list[float]] = {m: [] for m in modes}
    for rnd in range(args.repeats):
        order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
        for mode in order:
            seconds = run_mode(spark, mode, dsn, input_dir, work, rnd, args.partitions)
            rows, distinct = table_ids(dsn, f"bench_{mode}")
            if rows != total or distinct != total:
                print(f"{mode}: table holds {rows} rows ({distinct} distinct), expected {total}")
                return 1
            times[mode].append(seconds)

    print(f"\nrows: {args.batches} batches x {args.rows_per_batch} = {total}, "
          f"partitions {args.partitions or 'source'}, repeats: {args.repeats} (median)")
    print(f"{'mode':<14}{'seconds':>10}{'rows/s':>12}")
    for mode in modes:
        median = statistics.median(times[mode])
        print(f"{mode:<14}{median:>10.2f}{total / median:>12,.0f}")
    print_breakdown()
    medians = {mode: statistics.median(times[mode]) for mode in modes}
    if "exactly_once" in medians and "spark_jdbc" in medians:
        print(f"ratio exactly_once/spark_jdbc: "
              f"{medians['exactly_once'] / medians['spark_jdbc']:.2f}")
    plain = [m for m in PLAIN_MODES if m in medians]
    if "exactly_once" in medians and plain:
        fastest = min(plain, key=lambda m: medians[m])
        print(f"fastest plain write: {fastest}")
        if "format" in medians:
            print(f"ratio format/plain: {medians['format'] / medians[fastest]:.2f}")
        print(f"ratio exactly_once/plain: {medians['exactly_once'] / medians[fastest]:.2f}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
