"""Benchmark: the exactly-once DeltaSink against the fastest Delta write a user could pick.

Spark's own Delta sink (``delta-spark``) has no release for the pinned Spark (its newest,
4.4.1, needs pyspark <= 4.2.0: docs/connectors/delta.md), so the baseline is what a
PySpark job writes with delta-rs today, in the same SparkSession, on the same input
(``file_sink.py``'s: one Parquet file per micro-batch, ``trigger(availableNow=True)``):

* ``exactly_once``: ``foreachBatch(exactly_once(DeltaSink(out), name="bench"))``;
* ``format``: the same sink as ``writeStream.format("sparkeos-delta")``;
* ``write_deltalake``: ``foreachBatch(lambda df, id: write_deltalake(out, df.toArrow(),
  mode="append"))``, at-least-once (a replayed batch is appended again);
* ``python_floor``: a Python streaming sink that writes nothing (``bench/_floor.py``).

``--partitions N`` adds ``.repartition(N)`` to the source in every mode. Each full query
(start -> awaitTermination) is timed; the modes alternate for ``--repeats`` rounds and
medians are reported, after a warm-up run of each (``bench/_tables.py``). Every output is
read back with delta-rs: exactly-once modes must hold each input id once (else exit
status 1). The last lines are ``ratio exactly_once/write_deltalake: <x>`` and ``ratio
format/write_deltalake: <x>``.

    .venv/bin/python bench/delta_sink.py --rows-per-batch 100000 --batches 3 --partitions 20
"""

from __future__ import annotations

import sys
from typing import Any

import pyarrow.compute as pc
from _tables import TableBench, parse, run  # bench/ is the script's directory


def writer(source: Any, mode: str, out: str, work: str) -> tuple[Any, Any]:
    from sparkeos import exactly_once
    from sparkeos.connectors.delta import DeltaSink

    if mode == "exactly_once":
        adapter = exactly_once(DeltaSink(out), name="bench")
        return source.writeStream.foreachBatch(adapter), adapter
    if mode == "format":
        return source.writeStream.format("sparkeos-delta").option("path", out), None
    from deltalake import write_deltalake

    def append(df: Any, batch_id: int) -> None:
        write_deltalake(out, df.toArrow(), mode="append")

    return source.writeStream.foreachBatch(append), None


def count_output(out: str, work: str) -> tuple[int, int]:
    """(rows, distinct ids) of the Delta table at ``out``."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        ids = DeltaTable(out).to_pyarrow_table(columns=["id"]).column("id")
    except TableNotFoundError:
        return 0, 0
    return len(ids), pc.count_distinct(ids).as_py()


BENCH = TableBench("delta", ("exactly_once", "format", "write_deltalake"),
                   ("exactly_once", "format"), "write_deltalake", writer, count_output)


def main(argv: list[str] | None = None) -> int:
    return run(BENCH, parse(__doc__.split("\n\n")[0], argv))


if __name__ == "__main__":
    sys.exit(main())
