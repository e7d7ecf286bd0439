"""The soak case: a query that runs for days, compressed. Hundreds to thousands of tiny batches
through the real connector and destination, in process (no Spark: a batch costs what
the connector costs), with driver kills (a new coordinator, as a restarted query) and
failed task attempts (retried under the next attempt number) sprinkled in, and small
retention settings so every horizon (commit-log records, marker rows) is crossed many
times. What must stay bounded is sampled as it goes: the commit log's files, the
connector's own bookkeeping (``bookkeeping``), what is staged or prepared
(``leftovers``), and the driver's memory.

Marker ``soak``; ``SPARKEOS_SOAK_BATCHES`` scales it (the suite's default is
``soak_batches`` of the connector's class).
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.faults import ALL_POINTS, FaultPlan, InjectedCrash, InjectedTaskFailure
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.storage.logstores import LocalStore

from .inprocess import ArrowRunner, id_batch

SOAK_ENV = "SPARKEOS_SOAK_BATCHES"
RETAIN_BATCHES = 10
KILL_EVERY = 97
"""A driver kill (at a point drawn from every protocol point) every this many batches."""
RETRY_EVERY = 31
"""A failed first attempt of partition 0's task every this many batches."""


@dataclass
class SoakFigures:
    batches: int
    kills: int = 0
    retries: int = 0
    samples: list[dict[str, int]] = field(default_factory=list)

    def peak(self, key: str) -> int:
        return max((s.get(key, 0) for s in self.samples), default=0)

    def describe(self) -> str:
        keys = sorted({k for s in self.samples for k in s})
        peaks = ", ".join(f"{k} <= {self.peak(k)}" for k in keys)
        return (f"{self.batches} batches, {self.kills} driver kills, {self.retries} task "
                f"retries; peaks: {peaks}")


def soak_batches(default: int) -> int:
    configured = os.environ.get(SOAK_ENV, "").strip()
    return int(configured) if configured.isdigit() else default


def run_soak(workdir: str, make_sink: Callable[[], Any], key: str, batches: int,
             bookkeeping: Callable[[], dict[str, int]],
             leftovers: Callable[[], list[str] | None], seed: int = 23) -> SoakFigures:
    """Run ``batches`` batches of 2 partitions x 2 rows; returns the sampled figures.
    Ids are ``batch * 10 + 1..4``; the caller checks them once at the end."""
    rng = random.Random(seed)
    log_dir = os.path.join(workdir, "soak-log")
    log = CommitLog(LocalStore(log_dir))
    config = CoordinatorConfig(name="soak", retain_batches=RETAIN_BATCHES)
    figures = SoakFigures(batches)
    coordinator = Coordinator(make_sink(), config, log, key)
    sample_every = max(1, batches // 20)
    baseline_kb = 0
    batch_id = 0
    while batch_id < batches:
        rows = [id_batch([batch_id * 10 + 1, batch_id * 10 + 2]),
                id_batch([batch_id * 10 + 3, batch_id * 10 + 4])]
        retry = batch_id % RETRY_EVERY == RETRY_EVERY - 1
        kill = batch_id % KILL_EVERY == KILL_EVERY - 1
        faults = FaultPlan(rng.choice(ALL_POINTS), batch_id, simulate=True) if kill else None
        if faults is not None:
            coordinator = Coordinator(make_sink(), config, log, key, faults)

        def fail_first(partition: int, attempt: int, retry: bool = retry) -> None:
            if retry and partition == 0 and attempt == 0:
                raise InjectedTaskFailure("the first attempt's executor was lost")

        try:
            coordinator.run_batch(batch_id, ArrowRunner(rows, before_attempt=fail_first))
        except (InjectedCrash, Exception):
            if faults is None:
                raise
            # The driver died (or the injected task failure failed the batch): Spark
            # re-runs the batch after a restart, which recovers first.
            figures.kills += 1
            coordinator = Coordinator(make_sink(), config, log, key)
            continue
        figures.retries += int(retry)
        if faults is not None:  # the fault point was not on this batch's path
            coordinator = Coordinator(make_sink(), config, log, key)
        if batch_id % sample_every == 0 or batch_id == batches - 1:
            # No gc.collect() first: ru_maxrss is the peak, which a collection cannot
            # lower, and a full collection in a test process that has imported pyspark
            # and pyarrow cost 0.15 s or more each time.
            rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            baseline_kb = baseline_kb or rss_kb
            left = leftovers()
            figures.samples.append({
                "commit_log_files": len(os.listdir(log_dir)),
                "coordinator_states": len(coordinator.states()),
                "leftovers": len(left) if left is not None else 0,
                "rss_growth_mb": max(0, rss_kb - baseline_kb) // 1024,
                **bookkeeping(),
            })
        batch_id += 1
    with contextlib.suppress(Exception):
        coordinator.sink.close()
    Coordinator(make_sink(), config, log, key).recover(full=True)
    return figures


__all__ = ["RETAIN_BATCHES", "SOAK_ENV", "SoakFigures", "run_soak", "soak_batches"]
