"""Rows an attempt of a table sink holds back until there are enough for a file.

Spark hands a Python writer its rows in Arrow batches of 10,000
(``spark.sql.execution.arrow.maxRecordsPerBatch``); a table sink that wrote a file per
batch would leave many small files (a reader pays per file) and pay per file for the
attempt's manifest and a durable write. The attempt's rows are gathered here and written
as one file (per partition) when ``limit`` bytes of Arrow data are held, and at prepare:
files of the size Spark's own writers make, one per task and partition.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

FILE_BYTES = 64 * 1024 * 1024
"""Arrow bytes held before a file is written (Parquet's encoding makes it smaller)."""


def _file_bytes() -> int:
    return FILE_BYTES


@dataclass
class RowBuffer:
    limit: int = field(default_factory=_file_bytes)
    tables: list[pa.Table] = field(default_factory=list)
    held: int = 0

    def add(self, rows: pa.Table) -> bool:
        """Hold ``rows``; True when a file's worth is held (``take`` them)."""
        self.tables.append(rows)
        self.held += rows.nbytes
        return self.held >= self.limit

    def take(self) -> pa.Table | None:
        """Every row held, in the order added (None if none), and hold none."""
        if not self.tables:
            return None
        rows = self.tables[0] if len(self.tables) == 1 else pa.concat_tables(self.tables)
        self.tables, self.held = [], 0
        return rows


__all__ = ["FILE_BYTES", "RowBuffer"]
