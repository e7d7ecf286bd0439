"""A query that writes two exactly-once FileSinks into one directory (test job)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkeos import exactly_once
from sparkeos.connectors.file import FileSink

NAMES = ("orders-eu", "orders-us")


def two_file_sinks(path: str) -> Callable[[Any, int], None]:
    adapters = [exactly_once(FileSink(path), name=name) for name in NAMES]

    def write(df: Any, batch_id: int) -> None:
        for adapter in adapters:
            adapter(df, batch_id)

    return write
