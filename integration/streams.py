"""Streaming queries for in-process integration tests (JSON-lines input of id/payload)."""

from __future__ import annotations

from typing import Any

from sparkeos.testing.job import INPUT_SCHEMA


def id_stream(spark: Any, input_dir: str) -> Any:
    """A streaming DataFrame over the input files, one file per batch."""
    return (spark.readStream.schema(INPUT_SCHEMA).option("maxFilesPerTrigger", 1)
            .json(input_dir))


def run_available(df: Any, batch_fn: Any, checkpoint: str | None = None) -> None:
    """Run ``foreachBatch(batch_fn)`` over everything available, then stop."""
    writer = df.writeStream.foreachBatch(batch_fn).trigger(availableNow=True)
    if checkpoint:
        writer = writer.option("checkpointLocation", checkpoint)
    query = writer.start()
    try:
        query.awaitTermination()
    finally:
        query.stop()
