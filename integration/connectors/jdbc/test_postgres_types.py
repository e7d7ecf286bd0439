"""Drop-in means the same table: every Spark type Spark's JDBC writer writes to
PostgreSQL, through ``df.write.jdbc`` (Spark creates the table), through
``exactly_once(PostgresSink(create_table=True))`` and through
``exactly_once(SqlTableSink(create_table=True))`` (SQLAlchemy's PostgreSQL dialect), on
one batch in a session whose time zone is not UTC. The column types each creates and
every value, read back as PostgreSQL prints it, are compared; where they differ, the
difference is the one docs/connectors/postgres.md and sql.md ("Types") name, and no
other."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import psycopg2.extensions
import pytest

from sparkeos.testing.job import run_spec_process

from .types_job import TYPES_SCHEMA

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
DRIVER = "org.postgresql:postgresql:42.7.5"
DIFFERENCES: dict[str, tuple[str, str]] = {
    "ints": ("integer[]", "jsonb"), "names": ("text[]", "jsonb")}
"""Column -> (Spark's column type, sparkeos' column type) where they differ: arrays, which
sparkeos writes as ``jsonb`` as it writes maps and structs (for which Spark has no
mapping); their values are the same elements, as JSON."""
SQL_DIFFERENCES: dict[str, tuple[str, str]] = {
    "ints": ("integer[]", "text"), "names": ("text[]", "text")}
"""The same for the SQL sink, whose nested columns are text holding the JSON (any
dialect has text; not every one has a JSON type)."""
SQL_VALUE_DIFFERENCES: dict[tuple[int, str], tuple[str, str]] = {(3, "f32"): ("-0", "0")}
"""(id, column) -> (Spark's value, the SQL sink's) where they differ: psycopg2 sends a
float as a SQL literal, where ``-0.0`` is the number 0 (NaN and the infinities it
quotes, and they are kept)."""


def sqlalchemy_url(dsn: str) -> str:
    """The server's DSN as SQLAlchemy's psycopg2 URL (as test_postgres_sink makes it)."""
    from sqlalchemy.engine import make_url

    return make_url(dsn).set(drivername="postgresql+psycopg2").render_as_string(
        hide_password=False)


def _columns(cur: Any, table: str) -> dict[str, str]:
    cur.execute("SELECT column_name, format_type(atttypid, atttypmod) FROM "
                "information_schema.columns c JOIN pg_attribute a ON a.attname = "
                "c.column_name AND a.attrelid = %s::regclass WHERE c.table_name = %s",
                (f'"{table}"', table))
    return dict(cur.fetchall())


def _values(cur: Any, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    cur.execute("SET TIME ZONE 'UTC'")
    listed = ", ".join(f'"{column}"::text' for column in columns)
    cur.execute(f'SELECT {listed} FROM "{table}" ORDER BY id')
    return cur.fetchall()


@pytest.mark.spark
def test_every_type_lands_as_sparks_jdbc_writer_lands_it(pg_server: Any, names: Any,
                                                          admin: Any, tmp_path: Any) -> None:
    jar = subprocess.run(["bash", os.path.join(REPO, "docker/services/jars.sh"), DRIVER],
                         capture_output=True, text=True, check=True).stdout.strip()
    dsn = psycopg2.extensions.parse_dsn(pg_server.dsn)
    spark_table, sql_table = f"{names.table}_spark", f"{names.table}_sql"
    spec = {"dsn": pg_server.dsn, "jars": jar, "workdir": str(tmp_path),
            "url": f"jdbc:postgresql://{dsn['host']}:{dsn.get('port', 5432)}/{dsn['dbname']}",
            "user": dsn["user"], "password": dsn.get("password", ""),
            "spark_table": spark_table, "ours_table": names.table, "marker": names.marker,
            "sql_url": sqlalchemy_url(pg_server.dsn),
            "sql_table": sql_table}
    try:
        result = run_spec_process("integration.connectors.jdbc.types_job", spec,
                                  str(tmp_path / "spec.json"), cwd=REPO)
        assert result.returncode == 0 and "types job ok" in result.stdout, result.tail(60)
        with admin.cursor() as cur:
            theirs = _columns(cur, spark_table)
            names_in_order = [c.split()[0] for c in TYPES_SCHEMA.split(", ")]
            cur.execute(f'SELECT {", ".join(f"to_jsonb({c})" for c in DIFFERENCES)} '
                        f'FROM "{spark_table}" ORDER BY id')
            arrays_as_json = cur.fetchall()
            for table, expected, values_differ in (
                    (names.table, DIFFERENCES, {}),
                    (sql_table, SQL_DIFFERENCES, SQL_VALUE_DIFFERENCES)):
                ours = _columns(cur, table)
                assert set(theirs) == set(ours) == set(names_in_order), table
                differ = {c: (theirs[c], ours[c]) for c in names_in_order
                          if theirs[c] != ours[c]}
                assert differ == expected, (table, differ)
                same = [c for c in names_in_order if c not in expected]
                landed, spark_landed = _values(cur, table, same), _values(cur, spark_table, same)
                differ_in = {(int(row[0]), column): (spark_row[i], row[i])
                             for row, spark_row in zip(landed, spark_landed, strict=True)
                             for i, column in enumerate(same) if row[i] != spark_row[i]}
                assert differ_in == values_differ, table
                cur.execute(f'SELECT {", ".join(f"{c}::jsonb" for c in expected)} '
                            f'FROM "{table}" ORDER BY id')
                assert cur.fetchall() == arrays_as_json, table
    finally:
        with admin.cursor() as cur:
            for table in (spark_table, sql_table, f"{sql_table}__sparkeos_txn",
                          f"{sql_table}__sparkeos_stage"):
                cur.execute(f'DROP TABLE IF EXISTS "{table}"')


def test_an_array_column_spark_created_is_refused_before_writing(pg_server: Any, names: Any,
                                                                 admin: Any) -> None:
    """A table Spark's writer created holds arrays as ``T[]``: the sink names the column
    and writes nothing (docs/connectors/postgres.md, "Types")."""
    import pyarrow as pa

    from sparkeos.connectors.jdbc import PostgresSink
    from sparkeos.core.errors import SchemaMismatchError

    with admin.cursor() as cur:
        cur.execute(f'CREATE TABLE "{names.table}" (id integer, ints integer[])')
    sink = PostgresSink(dsn=pg_server.dsn, table=names.table, marker_table=names.marker)
    schema = pa.schema([("id", pa.int32()), ("ints", pa.list_(pa.int32()))])
    with pytest.raises(SchemaMismatchError, match="ints"):
        sink.validate(schema)


def test_the_sql_sink_refuses_an_array_column_spark_created(pg_server: Any, names: Any,
                                                             admin: Any) -> None:
    """The same refusal through the SQL sink: it writes nested values as JSON text, which
    an ``integer[]`` column cannot take."""
    import pyarrow as pa

    from sparkeos.connectors.sql import SqlTableSink
    from sparkeos.core.errors import SchemaMismatchError

    url = sqlalchemy_url(pg_server.dsn)
    with admin.cursor() as cur:
        cur.execute(f'CREATE TABLE "{names.table}" (id integer, ints integer[])')
    try:
        sink = SqlTableSink(url=url, table=names.table)
        schema = pa.schema([("id", pa.int32()), ("ints", pa.list_(pa.int32()))])
        with pytest.raises(SchemaMismatchError, match=r"ints \(INTEGER\[\]\)"):
            sink.validate(schema)
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{names.table}"')
