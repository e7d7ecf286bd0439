"""Spark's floor for a Python streaming sink: one that writes nothing (the benchmarks
compare the format route against it)."""

from __future__ import annotations

from typing import Any


def noop_source() -> type:
    """A Python streaming sink that writes nothing: Spark's own cost of the route."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )

    class Counted(WriterCommitMessage):  # type: ignore[misc]
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class NoopWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
        def write(self, iterator: Any) -> Counted:
            return Counted(sum(batch.num_rows for batch in iterator))

        def commit(self, messages: Any, batchId: int) -> None:
            pass

        def abort(self, messages: Any, batchId: int) -> None:
            pass

    class NoopSink(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "bench-noop"

        def streamWriter(self, schema: Any, overwrite: bool) -> NoopWriter:
            return NoopWriter()

    return NoopSink
