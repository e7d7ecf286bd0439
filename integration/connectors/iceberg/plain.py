"""The at-least-once write users do without sparkeos (test comparison): each batch
appended with pyiceberg, with no idempotence."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def plain_iceberg_writer(table: str, catalog: Mapping[str, str]) -> Callable[[Any, int], None]:
    def write(df: Any, batch_id: int) -> None:
        from pyiceberg.catalog import load_catalog

        rows = df.toArrow()
        if rows.num_rows:
            opened = load_catalog("default", **dict(catalog))
            opened.create_namespace_if_not_exists(table.rsplit(".", 1)[0])
            found = opened.create_table_if_not_exists(table, schema=rows.schema)
            found.append(rows.cast(found.schema().as_arrow()))

    return write
