"""The conformance suite's cases for a database or a broker on a bad network day.

Put ``WireFaultConformance`` first in the bases of a class that also subclasses the
connector's conformance class (whose fixtures, ``visible_ids`` and ``leftovers`` serve
here), and give it:

* ``wire_protocol``: ``POSTGRES``, ``KAFKA`` or ``STOMP`` (``sparkeos.testing.tcpproxy``);
* ``wire_upstream()``: the destination's ``host:port``;
* ``wire_sink(workdir, address)``: the sink, reaching the destination at ``address``
  (the proxy's) instead;
* ``wire_steps``: the named steps of the connector's commit path, and
  ``wire_faults(step)``: the faults put on each (``WireFault``: ``LOST_REPLY`` or
  ``RESET`` on the request its pattern matches).

The class then holds one case per step and no other case of the suite. Each runs
``BATCHES`` in process (no Spark), every connection of this process to the destination
through a ``TcpFaultProxy`` with the step's faults on. Tasks are retried once as Spark
retries a failed task; a batch that fails with a ``RetriableError`` restarts the driver,
as Spark restarts the query, at most ``MAX_RESTARTS`` times. It asserts that every
fault fired, that no failure blamed another writer (or claimed a loss), that the run
finished every batch (none stuck, none left to a later recovery), then, after a
restarted driver's full recovery, every id exactly once and no state left behind.

The run is single-threaded (tasks one after another, ``commit_parallelism=1``), so a
seeded fault hits the same request every run: a failure replays exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import (
    AttemptFencedError,
    DataLossError,
    RecordExistsError,
    RetriableError,
    TransactionIdCollisionError,
)
from sparkeos.core.protocol import TransactionalSink
from sparkeos.core.snapshot.commitlog import CommitLog
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.tasks import TaskAttempt, TaskFunction, TaskResult

from .inprocess import ListRunner
from .tcpproxy import TcpFaultProxy, WireFault

BATCHES = [[[1, 2], [3]], [[4], [5, 6]], [[7, 8], [9]]]
MAX_RESTARTS = 3
FALSE_ALARMS = (AttemptFencedError, TransactionIdCollisionError, RecordExistsError,
                DataLossError)
"""What a lost reply must never be taken for: another writer, or lost rows."""
WIRE_CASES = frozenset({"test_every_row_once_through_wire_faults"})


class RetryingRunner(ListRunner):
    """A ``ListRunner`` that retries a failed task under the next attempt number, as
    Spark does (``spark.task.maxFailures``), phase 2's commit tasks too; each failure
    is kept in ``failures``."""

    def __init__(self, partitions: list[list[int]], max_attempts: int = 2) -> None:
        super().__init__(partitions, max_attempts)
        self.failures: list[BaseException] = []

    def run_tasks(self, task: TaskFunction) -> list[TaskResult]:
        def attempt_of(partition: int, batch: pa.RecordBatch, attempt: int) -> TaskResult:
            return task(TaskAttempt(partition, attempt, f"r{self.run}-a{attempt}"),
                        iter([batch] if batch.num_rows else []))

        return [self._retried(functools.partial(attempt_of, partition, batch))
                for partition, batch in enumerate(self.data)]

    def run_in_tasks(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        def attempt_of(item: Any, _attempt: int) -> Any:
            return fn(item)

        return [self._retried(functools.partial(attempt_of, item)) for item in items]

    def _retried(self, attempt_of: Callable[[int], Any]) -> Any:
        """``attempt_of(attempt number)`` until it succeeds, at most ``max_attempts``."""
        for attempt in range(self.max_attempts):
            try:
                return attempt_of(attempt)
            except Exception as exc:
                self.failures.append(exc)
                if attempt + 1 == self.max_attempts:
                    raise
        raise AssertionError("unreachable")


def false_alarms(failures: Sequence[BaseException]) -> list[BaseException]:
    """The failures (or their causes) that blame another writer or claim a loss."""
    found: list[BaseException] = []
    for failure in failures:
        exc: BaseException | None = failure
        while exc is not None:
            if isinstance(exc, FALSE_ALARMS):
                found.append(exc)
                break
            exc = exc.__cause__ or exc.__context__
    return found


class WireFaultConformance:
    """The wire-fault cases of a connector, and no other case of its suite (see the
    module doc)."""

    wire_protocol: ClassVar[str]
    wire_steps: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in dir(cls):
            if name.startswith("test_") and name not in WIRE_CASES:
                setattr(cls, name, None)  # pytest collects no test of that name

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "wire_step" in metafunc.fixturenames:
            metafunc.parametrize("wire_step", self.wire_steps)

    # -- to implement --------------------------------------------------------------------
    def wire_upstream(self) -> str:
        raise NotImplementedError

    def wire_sink(self, workdir: str, address: str) -> TransactionalSink[Any]:
        raise NotImplementedError

    def wire_faults(self, step: str) -> list[WireFault]:
        raise NotImplementedError

    # -- the case -------------------------------------------------------------------------
    def test_every_row_once_through_wire_faults(self, workdir: str, wire_step: str) -> None:
        """Issue 37: a reply lost after the destination applied a request, or a
        connection reset before it, at one named step of the commit path: every id
        once, no false "another writer", no stuck batch, the fault really injected."""
        suite: Any = self
        expected = [i for batch in BATCHES for partition in batch for i in partition]
        with TcpFaultProxy(self.wire_upstream(), self.wire_protocol) as proxy:
            faults = [proxy.add(fault) for fault in self.wire_faults(wire_step)]
            sink = self.wire_sink(workdir, proxy.address)
            try:
                failures = self._run_batches(workdir, sink)
                unfired = [fault for fault in faults if not fault.fired]
                assert faults and not unfired, (
                    f"faults that never fired: {unfired}; the last requests seen: "
                    f"{proxy.requests[-30:]}")
                assert not false_alarms(failures), false_alarms(failures)
                # Not stuck: the run itself finished every batch (no recovery after it).
                batches = CommitLog(suite.in_process_store(workdir)).batches()
                unfinished = [b for b in range(len(BATCHES))
                              if b not in batches or batches[b].finished is None]
                assert not unfinished, f"batches left unfinished: {unfinished}; {failures}"
                proxy.clear()
                suite.finish(workdir, sink, expected)
            finally:
                sink.close()

    def _run_batches(self, workdir: str, sink: TransactionalSink[Any]) -> list[BaseException]:
        """``BATCHES`` in order, the driver restarted on a ``RetriableError``; returns
        every failure met (tasks' and batches')."""
        suite: Any = self

        def driver() -> Coordinator:
            config = CoordinatorConfig(name=suite.IN_PROCESS_SINK, commit_parallelism=1)
            return Coordinator(sink, config, CommitLog(suite.in_process_store(workdir)),
                               suite.in_process_key(workdir))

        failures: list[BaseException] = []
        restarts = 0
        coordinator = driver()
        batch_id = 0
        while batch_id < len(BATCHES):
            runner = RetryingRunner(BATCHES[batch_id])
            try:
                coordinator.run_batch(batch_id, runner)
                batch_id += 1
            except RetriableError as exc:
                # The query stops and Spark restarts it: recovery finishes or rolls
                # back the batch, which then runs again.
                failures.append(exc)
                restarts += 1
                assert restarts <= MAX_RESTARTS, failures
                coordinator = driver()
            finally:
                failures += runner.failures
        return failures


__all__ = ["BATCHES", "MAX_RESTARTS", "RetryingRunner", "WireFaultConformance",
           "false_alarms"]
