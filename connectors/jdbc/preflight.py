"""What is checked on the driver before a batch writes anything: the server is
reachable, it has prepared-transaction slots (and enough for the batch's participants),
the table exists (or is created from the DataFrame's schema), the DataFrame's columns fit
its column types, an upsert key has a unique index, and the marker table exists.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import ConfigurationError, SchemaMismatchError
from sparkeos.core.observe import log_event

from . import arrowpg, database, markers
from .config import PostgresConfig
from .errors import prepared_limit_error

CREATE_TABLE_SETTINGS = ("PostgresSink(create_table=True), or the format option "
                         "sparkeos.createTable=true (the formats' default)")

# (dsn, table, ..., schema) -> when the check expires; validate runs before every batch on
# the driver, and the catalog rarely changes under a running query.
_VALIDATED: dict[tuple[Any, ...], float] = {}
VALIDATION_TTL_S = 300.0
# max_prepared_transactions per DSN, read by validate(): a restart of PostgreSQL is
# needed to change it.
_PREPARED_LIMIT: dict[str, int] = {}

Columns = Mapping[str, tuple[str, str, str, bool, bool, bool]]
"""Table column -> (type name, type category, shown type, NOT NULL, has a default,
generated)."""


def validate(config: PostgresConfig, schema: pa.Schema) -> None:
    names = config.target_names(schema)
    cache_key = (config.dsn, config.table, config.mode, config.commit_in_task, config.key,
                 config.order_by, config.marker_table,
                 config.create_table, names,
                 tuple((f.name, str(f.type), f.nullable) for f in schema))
    if _VALIDATED.get(cache_key, 0.0) > time.monotonic():
        return
    database.run(config, "checking the destination table",
                 lambda conn: _validate_on(config, conn, schema, names), phase="setup")
    _VALIDATED[cache_key] = time.monotonic() + VALIDATION_TTL_S


def check_participants(config: PostgresConfig, count: int) -> None:
    """Every participant holds a prepared transaction until phase 2: refuse a batch the
    server's max_prepared_transactions (read by ``validate``) cannot hold."""
    limit = _PREPARED_LIMIT.get(config.dsn)
    if not config.prepared_appends or limit is None or limit >= 2 * count:
        return
    raise ConfigurationError(
        f"{count} participants would hold a prepared transaction at once until their "
        f"phase 2 (this batch's, and with overlap_commits those of the batch still "
        f"committing; a retried or speculative attempt holds one more), but "
        f"{config.target} allows max_prepared_transactions = {limit}: at least "
        f"{2 * count} are needed; nothing was written",
        fix=f"write with fewer transactions: exactly_once(..., writers={max(1, limit // 2)})"
        f" (or fewer); or raise max_prepared_transactions to at least {2 * count} x the "
        "sinks writing to this server and restart PostgreSQL")


def _validate_on(config: PostgresConfig, conn: Any, schema: pa.Schema,
                 names: tuple[str, ...]) -> None:
    with conn.cursor() as cur:
        if config.prepared_appends:
            cur.execute("SHOW max_prepared_transactions")
            limit = int(cur.fetchone()[0])
            _PREPARED_LIMIT[config.dsn] = limit
            if limit == 0:
                raise prepared_limit_error(0, target=config.target)
        columns = _table_columns(config, conn, cur)
        if columns is None:
            if not config.create_table:
                raise ConfigurationError(
                    f"table {config.table} does not exist on {config.target}, and creating "
                    "it is off",
                    fix=f"create it, or let sparkeos create it from the DataFrame's schema: "
                    f"{CREATE_TABLE_SETTINGS}; nothing was written",
                )
            cur.execute(_create_table_sql(config, schema, names))
            log_event("postgres.table_created", table=config.table, target=config.target)
            columns = _table_columns(config, conn, cur)
            assert columns is not None
        _check_fit(config, schema, names, columns)
        if config.mode == "upsert":
            _check_unique_key(config, cur)
        if not config.plain_upserts:
            markers.ensure_table(cur, config.ident(config.marker_table))


def _table_columns(config: PostgresConfig, conn: Any, cur: Any) -> Columns | None:
    name = config.ident(config.table).as_string(conn)
    cur.execute("SELECT to_regclass(%s)::oid", (name,))
    oid = cur.fetchone()[0]
    if oid is None:
        return None
    generated = "a.attgenerated <> ''" if conn.server_version >= 120000 else "false"
    cur.execute(
        "SELECT a.attname::text, t.typname::text, t.typcategory::text,"
        " format_type(a.atttypid, a.atttypmod), a.attnotnull,"
        " a.atthasdef OR a.attidentity <> '', " + generated +
        " FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid"
        " WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (oid,),
    )
    return {r[0]: (r[1], r[2], r[3], r[4], r[5], r[6]) for r in cur.fetchall()}


def _check_fit(config: PostgresConfig, schema: pa.Schema, names: tuple[str, ...],
               columns: Columns) -> None:
    problems = _type_problems(schema, names, columns)
    required = [n for n, (_t, _c, _s, notnull, has_default, gen) in columns.items()
                if notnull and not has_default and not gen and n not in names]
    if required:
        problems.append("NOT NULL columns without a default not in the DataFrame: "
                        + ", ".join(required))
    for k in config.key or ():
        if k not in names:
            problems.append(f"key column {k} is not written by the DataFrame")
    for c in config.order_by or ():
        if c not in names:
            problems.append(f"order_by column {c} is not written by the DataFrame")
    if problems:
        raise SchemaMismatchError(
            f"the DataFrame does not fit table {config.table} on {config.target}: "
            + "; ".join(problems),
            fix="select/cast/rename the DataFrame's columns (or pass columns={df_name: "
            "table_name}), or alter the table; nothing was written",
        )


def _type_problems(schema: pa.Schema, names: tuple[str, ...], columns: Columns) -> list[str]:
    problems: list[str] = []
    missing = [n for n in names if n not in columns]
    if missing:
        problems.append("missing in the table: " + ", ".join(missing))
    for f, name in zip(schema, names, strict=True):
        if name not in columns:
            continue
        typname, category, shown, _notnull, _default, generated = columns[name]
        if generated:
            problems.append(f"{name} is a generated column and cannot be written")
        elif not arrowpg.accepts(f.type, typname, category):
            label = name if name == f.name else f"{f.name} -> {name}"
            problems.append(f"{label}: DataFrame type {f.type} does not fit column type "
                            f"{shown}")
    return problems


def _check_unique_key(config: PostgresConfig, cur: Any) -> None:
    cur.execute(
        "SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey) k"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k)"
        " FROM pg_index i WHERE i.indrelid = to_regclass(%s) AND i.indisunique"
        " AND i.indpred IS NULL AND i.indexprs IS NULL",
        (config.ident(config.table).as_string(cur.connection),),
    )
    wanted = set(config.key or ())
    if not any(set(row[0]) == wanted for row in cur.fetchall()):
        cols = ", ".join(config.key or ())
        raise SchemaMismatchError(
            f"mode='upsert' needs a unique index or primary key on ({cols}) of table "
            f"{config.table}",
            fix=f"CREATE UNIQUE INDEX ON {config.table} ({cols}); or create the table with "
            "create_table=True (the key becomes its primary key); nothing was written",
        )


def _create_table_sql(config: PostgresConfig, schema: pa.Schema, names: tuple[str, ...]) -> Any:
    from psycopg2 import sql

    defs = []
    for f, name in zip(schema, names, strict=True):
        not_null = " NOT NULL" if not f.nullable else ""
        defs.append(sql.SQL("{} " + arrowpg.pg_type(f.type) + not_null).format(
            sql.Identifier(name)))
    if config.key:
        defs.append(sql.SQL("PRIMARY KEY ({})").format(
            sql.SQL(", ").join(sql.Identifier(k) for k in config.key)))
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
        config.ident(config.table), sql.SQL(", ").join(defs))
