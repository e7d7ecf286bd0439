"""``core.streaming.ending`` against pyspark's own classes, without a JVM: ``spark.stop()`` waits
for background commits only so long, and a failure it raises comes after pyspark's
clean-up of the session (the integration tests run the real thing:
``integration/core/test_query_end.py``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.snapshot.overlap import CommitsInFlight
from sparkeos.core.streaming import ending


@pytest.fixture
def wrapped(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """pyspark's classes wrapped for this test only (restored after it); the context's
    own stop stands in for the JVM's and records its calls."""
    for cls, name in ((StreamingQuery, "stop"), (StreamingQuery, "awaitTermination"),
                      (StreamingQuery, "processAllAvailable"), (SparkSession, "stop")):
        monkeypatch.setattr(cls, name, getattr(cls, name))
    stopped: list[Any] = []

    def stop(self: Any) -> None:
        stopped.append(self)
        STOPPED.set()

    STOPPED.clear()
    monkeypatch.setattr(SparkContext, "stop", stop)
    ending._wrap_pyspark()
    yield stopped


STOPPED = threading.Event()


class Adapter:
    name = "out"

    def __init__(self, flush: Any) -> None:
        self.flush = flush


@pytest.fixture
def held() -> Iterator[list[Adapter]]:
    adapters: list[Adapter] = []
    yield adapters
    for adapter in adapters:
        ending._ADAPTERS.discard(adapter)  # type: ignore[arg-type]


def hold(held: list[Adapter], flush: Any) -> None:
    adapter = Adapter(flush)
    held.append(adapter)
    ending._ADAPTERS.add(adapter)  # type: ignore[arg-type]


def test_session_stop_cleans_up_then_raises_the_commit_s_failure(
        wrapped: list[Any], held: list[Adapter]) -> None:
    def failed() -> None:
        raise RuntimeError("background commit of batch 7 failed")

    hold(held, failed)
    session = SparkSession.__new__(SparkSession)
    session._sc = SparkContext.__new__(SparkContext)
    session._jvm = mock.MagicMock()
    SparkSession._instantiatedSession = SparkSession._activeSession = session
    try:
        with pytest.raises(RuntimeError, match="batch 7"):
            session.stop()
        assert wrapped, "the context was stopped"
        assert SparkSession._instantiatedSession is None, "pyspark's clean-up ran"
        assert SparkSession._activeSession is None
    finally:
        SparkSession._instantiatedSession = SparkSession._activeSession = None


def test_spark_stop_waits_only_so_long_then_stops_the_context(
        wrapped: list[Any], held: list[Adapter], monkeypatch: pytest.MonkeyPatch) -> None:
    """A background commit whose tasks find no executor must not hold ``spark.stop()``
    for ever: past ``STOP_WAIT_S`` the context stops (the commit then fails in Spark and
    ends in the driver's process), and the stop returns once it ended."""
    monkeypatch.setattr(ending, "STOP_WAIT_S", 0.05)
    executors = threading.Event()
    flight = CommitsInFlight()
    flight.start(7, executors.wait, "sparkeos-commit-out-7", {})
    hold(held, flight.wait)
    context = SparkContext.__new__(SparkContext)
    stopper = threading.Thread(target=lambda: SparkContext.stop(context), daemon=True)
    stopper.start()
    assert STOPPED.wait(60), "spark.stop() never stopped the context"
    assert wrapped == [context]
    assert stopper.is_alive(), "spark.stop() returned before the commit ended"
    executors.set()  # the commit ends (in the driver's process, in production)
    stopper.join()


@pytest.mark.parametrize(("setting", "guarantee", "connect", "overlaps"), [
    (None, Guarantee.EXACTLY_ONCE, False, True),  # the default, where the end is held
    (None, Guarantee.EXACTLY_ONCE, True, False),  # Connect: no hook reaches the server
    (True, Guarantee.EXACTLY_ONCE, True, False),
    (None, Guarantee.AT_LEAST_ONCE, False, False),
    (True, Guarantee.AT_LEAST_ONCE, False, False),
    (False, Guarantee.EXACTLY_ONCE, False, False),
    (True, Guarantee.EXACTLY_ONCE, False, True),
])
def test_overlap_is_on_by_default_where_the_end_of_the_query_is_held(
        setting: bool | None, guarantee: Guarantee, connect: bool, overlaps: bool) -> None:
    config = CoordinatorConfig(name="out", guarantee=guarantee, overlap_commits=setting)
    assert ending.overlaps(config, connect) is overlaps
    assert ending.holds(config) is (guarantee is Guarantee.EXACTLY_ONCE
                                    and setting is not False)


def test_a_coordinator_used_directly_commits_before_a_batch_returns() -> None:
    """No adapter holds the end of its queries (the format route, the CLI, tests): the
    default (None) is off, each batch visible when ``run_batch`` returns."""
    from sparkeos.core.snapshot.commitlog import CommitLog
    from sparkeos.core.snapshot.coordinator import Coordinator
    from tests.support.memory import ListRunner, MemorySink, MemoryStore, MemorySystem

    system = MemorySystem()
    coordinator = Coordinator(MemorySink(system), CoordinatorConfig(name="out"),
                              CommitLog(MemoryStore()), "q")
    metrics = coordinator.run_batch(0, ListRunner([[1, 2], [3]]))
    assert metrics.outcome == "committed" and sorted(system.visible) == [1, 2, 3]
