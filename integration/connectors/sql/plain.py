"""The at-least-once write users do without sparkeos (test comparison)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def plain_sql_writer(url: str, table: str) -> Callable[[Any, int], None]:
    def write(df: Any, batch_id: int) -> None:
        import sqlalchemy as sa

        rows = [row.asDict() for row in df.collect()]
        if not rows:
            return
        engine = sa.create_engine(url, connect_args={"timeout": 60})
        target = sa.Table(table, sa.MetaData(), sa.Column("id", sa.BigInteger),
                          sa.Column("payload", sa.Text))
        target.create(engine, checkfirst=True)
        with engine.begin() as conn:
            conn.execute(target.insert(), rows)
        engine.dispose()

    return write
