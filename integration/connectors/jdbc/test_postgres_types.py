"""Drop-in means the same table: every Spark type Spark's JDBC writer writes to
PostgreSQL, through ``df.write.jdbc`` (Spark creates the table) and through
``exactly_once(PostgresSink(create_table=True))``, on one batch in a session whose time
zone is not UTC. The column types each creates and every value, read back as PostgreSQL
prints it, are compared; where they differ, the difference is the one docs/connectors/
postgres.md ("Types") names, and no other."""

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
    spark_table = f"{names.table}_spark"
    spec = {"dsn": pg_server.dsn, "jars": jar, "workdir": str(tmp_path),
            "url": f"jdbc:postgresql://{dsn['host']}:{dsn.get('port', 5432)}/{dsn['dbname']}",
            "user": dsn["user"], "password": dsn.get("password", ""),
            "spark_table": spark_table, "ours_table": names.table, "marker": names.marker}
    try:
        result = run_spec_process("integration.connectors.jdbc.types_job", spec,
                                  str(tmp_path / "spec.json"), cwd=REPO)
        assert result.returncode == 0 and "types job ok" in result.stdout, result.tail(60)
        with admin.cursor() as cur:
            theirs, ours = _columns(cur, spark_table), _columns(cur, names.table)
            names_in_order = [c.split()[0] for c in TYPES_SCHEMA.split(", ")]
            assert set(theirs) == set(ours) == set(names_in_order)
            differ = {c: (theirs[c], ours[c]) for c in names_in_order if theirs[c] != ours[c]}
            assert differ == DIFFERENCES, differ
            same = [c for c in names_in_order if c not in DIFFERENCES]
            assert _values(cur, names.table, same) == _values(cur, spark_table, same)
            arrays = list(DIFFERENCES)
            cur.execute(f'SELECT {", ".join(f"to_jsonb({c})" for c in arrays)} '
                        f'FROM "{spark_table}" ORDER BY id')
            as_json = cur.fetchall()
            cur.execute(f'SELECT {", ".join(arrays)} FROM "{names.table}" ORDER BY id')
            assert cur.fetchall() == as_json
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP TABLE IF EXISTS "{spark_table}"')


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
