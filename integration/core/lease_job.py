"""A foreachBatch function for the lease test under Spark Connect (it runs in the
server's Python process): writes batches exactly once, and holds batch 0 until the test
drops a ``release`` file, signalling ``in-batch-0`` once it is written."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from sparkeos import exactly_once
from sparkeos.connectors.file import FileSink


def held_batches(out: str, signals: str, checkpoint: str,
                 lease_ttl_s: float) -> Callable[[Any, int], None]:
    adapter = exactly_once(FileSink(out), name="files", checkpoint_location=checkpoint,
                           lease_ttl_s=lease_ttl_s)

    def batch(df: Any, batch_id: int) -> None:
        adapter(df, batch_id)
        if batch_id == 0:
            os.makedirs(signals, exist_ok=True)
            open(os.path.join(signals, "in-batch-0"), "w").close()
            deadline = time.monotonic() + 300
            while (not os.path.exists(os.path.join(signals, "release"))
                   and time.monotonic() < deadline):
                time.sleep(0.05)

    return batch
