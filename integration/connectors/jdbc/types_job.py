"""Spark's JDBC writer and sparkeos' PostgreSQL and SQL sinks on one batch (test harness).

    python -m integration.connectors.jdbc.types_job spec.json

The spec names the DSN, the JDBC URL and user, the PostgreSQL driver's jar, the two
tables (Spark's ``df.write.jdbc`` creates one, ``PostgresSink(create_table=True)`` under
``exactly_once`` another, ``SqlTableSink(create_table=True)`` through SQLAlchemy the
third) and a working directory. Both write the rows of
``TYPES_ROWS`` in a session whose time zone is not UTC.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import sys
from typing import Any

ZONE = "America/Los_Angeles"
TYPES_SCHEMA = (
    "id int, b boolean, i8 tinyint, i16 smallint, i32 int, i64 bigint, f32 float, "
    "f64 double, d38 decimal(38,18), d10 decimal(10,2), s string, bin binary, day date, "
    "ts timestamp, ntz timestamp_ntz, ints array<int>, names array<string>")
"""Every Spark type Spark's JDBC writer writes to PostgreSQL (it has no mapping for
maps and structs; sparkeos writes those as ``jsonb``)."""
BIG = decimal.Decimal("12345678901234567890.123456789012345678")
TYPES_ROWS: list[tuple[Any, ...]] = [
    (1, True, 1, 2, 3, 4, 1.5, 0.1, BIG, decimal.Decimal("-99999999.99"), "plain",
     b"\x00\xffbytes", dt.date(1970, 1, 1), dt.datetime(2026, 1, 2, 3, 4, 5, 123456),
     dt.datetime(2026, 7, 2, 3, 4, 5, 999999), [1, None, 3], ["a", "b"]),
    (2, False, -128, -32768, -2147483648, -9223372036854775808, float("nan"), float("inf"),
     decimal.Decimal("0E-18"), decimal.Decimal("0.00"), 'quote " back \\ tab \t é 字 😀',
     b"", dt.date(1, 1, 1), dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
     dt.datetime(1900, 1, 1), [], []),
    (3, None, 127, 32767, 2147483647, 9223372036854775807, -0.0, float("-inf"),
     decimal.Decimal("0.000000012345678901"), decimal.Decimal("12.30"), "",
     None, dt.date(9999, 12, 31), dt.datetime(2026, 3, 29, 1, 30), None, None, [None]),
    (4, None, None, None, None, None, 3.4028235e38, 1e-7, None, None, None, None, None,
     None, None, [None], None),
]


def main(argv: list[str]) -> int:
    from sparkeos import exactly_once
    from sparkeos.connectors.jdbc import PostgresSink
    from sparkeos.connectors.sql import SqlTableSink
    from sparkeos.core.streaming.spark import local_session
    from sparkeos.testing.job import end_job

    with open(argv[0]) as fh:
        spec = json.load(fh)
    spark = local_session("sparkeos-types", conf={"spark.jars": spec["jars"],
                                                  "spark.sql.session.timeZone": ZONE})
    batch = spark.createDataFrame(TYPES_ROWS, TYPES_SCHEMA).coalesce(1)
    batch.write.jdbc(spec["url"], spec["spark_table"], mode="append",
                     properties={"user": spec["user"], "password": spec["password"],
                                 "driver": "org.postgresql.Driver"})
    source = os.path.join(spec["workdir"], "in")
    batch.write.parquet(source)
    sinks = {"ckpt": PostgresSink(dsn=spec["dsn"], table=spec["ours_table"],
                                  marker_table=spec["marker"], create_table=True),
             "ckpt-sql": SqlTableSink(url=spec["sql_url"], table=spec["sql_table"],
                                      create_table=True)}
    for checkpoint, sink in sinks.items():
        query = (spark.readStream.schema(TYPES_SCHEMA).parquet(source).writeStream
                 .foreachBatch(exactly_once(sink, name="types"))
                 .option("checkpointLocation", os.path.join(spec["workdir"], checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    print("types job ok", flush=True)
    return end_job(spark)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
