"""The at-least-once write users do without sparkeos (test comparison): each batch
appended with delta-rs, with no idempotence."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def plain_delta_writer(path: str) -> Callable[[Any, int], None]:
    def write(df: Any, batch_id: int) -> None:
        from deltalake import write_deltalake

        table = df.toArrow()
        if table.num_rows:
            write_deltalake(path, table, mode="append")

    return write
