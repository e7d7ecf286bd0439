"""What users write today without sparkeos: an at-least-once insert per partition."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def plain_insert_writer(dsn: str, table: str) -> Callable[[Any, int], None]:
    def write(df: Any, batch_id: int) -> None:
        import psycopg2

        columns = df.columns
        # Once, on the driver: concurrent CREATE TABLE IF NOT EXISTS from two tasks can
        # collide in PostgreSQL's catalog (unique violation on pg_type).
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute(f'CREATE TABLE IF NOT EXISTS "{table}" (id bigint, payload text)')

        def insert_partition(rows: Iterator[Any]) -> None:
            import psycopg2
            from psycopg2.extras import execute_values

            with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
                execute_values(
                    cur, f'INSERT INTO "{table}" ({", ".join(columns)}) VALUES %s',
                    [tuple(r) for r in rows], page_size=1000)

        df.foreachPartition(insert_partition)

    return write
