"""The conformance suite's case for a store on a bad network day.

Mix ``StoreWireFaultCases`` into a conformance class whose sink keeps its state on an
object store (before it: ``class TestX(StoreWireFaultCases, CheckpointOnS3,
TestFileSinkParquet)``). The class says where the store is and how this process is
pointed elsewhere: ``store_upstream()`` (its ``http://host:port``) and
``route_store_through(endpoint, monkeypatch)`` (S3: ``AWS_ENDPOINT_URL_S3``; GCS:
``STORAGE_EMULATOR_HOST``; Azure: the connection string's ``BlobEndpoint``). The case
runs batches in process with every request of this process to the store passing
through a ``FaultProxy`` that loses the replies of applied writes, answers ``503
SlowDown`` and resets connections, then checks every id once, no leftovers, and that
the faults happened. A request the store fails past every retry fails its batch with a
``RetriableError``: the case restarts the driver then, as Spark restarts the query.

The run is single-threaded (tasks one after another, ``commit_parallelism=1``), so the
seeded faults hit the same requests every run: a failure replays exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import RetriableError
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator

from .inprocess import ListRunner
from .wireproxy import LOST_REPLY, RESET, SLOW_DOWN, Fault, FaultProxy

BATCHES = [[[1, 2], [3]], [[4], [5, 6]], [[7, 8, 9], [10]], [[11], [12]]]
MAX_RESTARTS = 3
"""A batch may fail when the store fails a request past every retry (a
``RetriableError``); the query restarts then, and must get through."""


class StoreWireFaultCases:
    # Given by a class after this one in the bases (declared, not defined: a definition
    # here would come first in the method resolution order).
    store_upstream: Callable[[], str]
    """The store's ``http://host:port``, which the proxy forwards to."""
    route_store_through: Callable[[str, pytest.MonkeyPatch], None]
    """Point this process's clients of the store at an endpoint (the proxy's)."""

    def test_every_row_once_when_the_store_loses_replies(self, workdir: str,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
        """Issue 37: replies lost after the store applied a write (a third of the
        conditional writes, a fifth of the others), 503 SlowDown and reset connections
        on a share of every request: no false "another writer", no stuck batch, every
        row once."""
        suite: Any = self
        with FaultProxy(self.store_upstream()) as proxy:
            self.route_store_through(proxy.endpoint, monkeypatch)
            for method in ("PUT", "POST"):  # S3 and Azure write by PUT, GCS uploads by POST
                proxy.add(Fault(LOST_REPLY, method=method, conditional=True, fraction=0.3))
                proxy.add(Fault(LOST_REPLY, method=method, conditional=False, fraction=0.2))
            proxy.add(Fault(SLOW_DOWN, fraction=0.05, seed=38))
            proxy.add(Fault(RESET, fraction=0.05, seed=39))
            sink = suite.sink_factory(workdir)
            restarts = 0

            def driver() -> Coordinator:
                log = CommitLog(suite.in_process_store(workdir))
                config = CoordinatorConfig(name=suite.IN_PROCESS_SINK, commit_parallelism=1)
                return Coordinator(sink, config, log, suite.in_process_key(workdir))

            coordinator = driver()
            batch_id = 0
            while batch_id < len(BATCHES):
                try:
                    coordinator.run_batch(batch_id, ListRunner(BATCHES[batch_id]))
                    batch_id += 1
                except RetriableError:
                    # The store failed past every retry: the query stops and Spark
                    # restarts it, which recovers and runs the batch again.
                    restarts += 1
                    assert restarts <= MAX_RESTARTS, proxy.injected
                    coordinator = driver()
            hurt = {action for action, _method, _path in proxy.injected}
            assert {LOST_REPLY, SLOW_DOWN, RESET} <= hurt, proxy.injected
            suite.finish(workdir, sink, [i for batch in BATCHES for p in batch for i in p])
