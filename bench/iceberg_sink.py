"""Benchmark: the exactly-once IcebergSink against the fastest Iceberg write a user
could pick.

Spark's own Iceberg writer (``iceberg-spark-runtime``) has no release for the pinned
Spark (docs/connectors/iceberg.md, "Compared with what"), so the baseline is what a
PySpark job writes with pyiceberg today, in the same SparkSession, on the same input
(``file_sink.py``'s: one Parquet file per micro-batch, ``trigger(availableNow=True)``),
into a SQL catalog on SQLite with a local warehouse:

* ``exactly_once``: ``foreachBatch(exactly_once(IcebergSink("bench.t", catalog), ...))``;
* ``format``: the same sink as ``writeStream.format("sparkeos-iceberg")``;
* ``pyiceberg_append``: ``foreachBatch(lambda df, id: table.append(df.toArrow()))``,
  at-least-once (a replayed batch is appended again);
* ``python_floor``: a Python streaming sink that writes nothing (``bench/_floor.py``).

``--partitions N`` adds ``.repartition(N)`` to the source in every mode; the loop, the
warm-up and the medians are ``bench/_tables.py``'s. Every output is read back with
pyiceberg: exactly-once modes must hold each input id once (else exit status 1). The
last lines are ``ratio exactly_once/pyiceberg_append: <x>`` and ``ratio
format/pyiceberg_append: <x>``.

    .venv/bin/python bench/iceberg_sink.py --rows-per-batch 100000 --batches 3 --partitions 20
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pyarrow.compute as pc
from _tables import TableBench, parse, run  # bench/ is the script's directory

TABLE = "bench.t"


def catalog_of(out: str) -> dict[str, str]:
    os.makedirs(os.path.join(out, "warehouse"), exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{out}/catalog.db",
            "warehouse": f"file://{out}/warehouse"}


def writer(source: Any, mode: str, out: str, work: str) -> tuple[Any, Any]:
    from sparkeos import exactly_once
    from sparkeos.connectors.iceberg import IcebergSink

    properties = catalog_of(out)
    if mode == "exactly_once":
        adapter = exactly_once(IcebergSink(TABLE, catalog=properties), name="bench")
        return source.writeStream.foreachBatch(adapter), adapter
    if mode == "format":
        options = {"path": TABLE, **{f"sparkeos.catalog.{k}": v for k, v in properties.items()}}
        return source.writeStream.format("sparkeos-iceberg").options(**options), None

    tables: list[Any] = []  # the table, loaded once per query as a user's job would

    def append(df: Any, batch_id: int) -> None:
        rows = df.toArrow()
        if not tables:
            from pyiceberg.catalog import load_catalog

            catalog = load_catalog("default", **properties)
            catalog.create_namespace_if_not_exists("bench")
            tables.append(catalog.create_table_if_not_exists(TABLE, schema=rows.schema))
        tables[0].append(rows)

    return source.writeStream.foreachBatch(append), None


def count_output(out: str, work: str) -> tuple[int, int]:
    """(rows, distinct ids) of the table in the catalog at ``out``."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    if not os.path.exists(os.path.join(out, "catalog.db")):
        return 0, 0
    try:
        table = load_catalog("default", **catalog_of(out)).load_table(TABLE)
    except NoSuchTableError:
        return 0, 0
    ids = table.scan(selected_fields=("id",)).to_arrow().column("id")
    return len(ids), pc.count_distinct(ids).as_py()


BENCH = TableBench("iceberg", ("exactly_once", "format", "pyiceberg_append"),
                   ("exactly_once", "format"), "pyiceberg_append", writer, count_output)


def main(argv: list[str] | None = None) -> int:
    return run(BENCH, parse(__doc__.split("\n\n")[0], argv))


if __name__ == "__main__":
    sys.exit(main())
