"""The plain foreachBatch STOMP producer users write without sparkeos (at-least-once).

The baseline of the conformance suite (a crash after the write and before Spark
records the batch duplicates it) and of ``bench/stomp_sink.py``: one stomp.py
connection per task, persistent sends with a receipt on the last one, the same
message encoding as ``StompSink``, no duplicate IDs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from sparkeos.core.text.records import RecordLayout, iter_records

from .client import Endpoint, StompClient


def plain_foreachbatch_writer(url: str, destination: str, body_column: str | None = None,
                              destination_type: str | None = "ANYCAST"
                              ) -> Callable[[Any, int], None]:
    """A foreachBatch function sending every row of the batch to ``destination``."""
    layout = RecordLayout(destination, None, None, body_column, None, None, None,
                          target="destination", owner="plain writer")
    endpoint = Endpoint.parse(url)
    headers = {"persistent": "true"}
    if destination_type:
        headers["destination-type"] = destination_type

    def send_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        def frames() -> Iterator[tuple[str, bytes, dict[str, str]]]:
            for batch in batches:
                for _dest, value, _key, _headers in iter_records(layout.serialize(batch)):
                    yield destination, value or b"", headers

        with StompClient(endpoint) as client:
            rows = client.send_all(frames(), f"plain write to {destination}")
        yield pa.RecordBatch.from_pydict({"rows": [rows]})

    def write(df: Any, batch_id: int) -> None:
        df.mapInArrow(send_partition, "rows long").collect()

    return write
