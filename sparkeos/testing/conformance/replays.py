"""Conformance cases for replays that differ from the run that crashed.

Spark replays a batch's input, not its partitioning: a restart on fewer cores, another
``repartition`` or another ``writers`` setting hands the same rows to other partitions.
A connector that keeps markers per (batch, partition) must never skip a participant of
a replay on the marker alone (the rule of ``core.snapshot.replay``); every connector must end
with every row at least once under ``at_least_once`` and exactly once under
``exactly_once``, whatever the replay's partition count, and with nothing left open.

``ConnectorConformance`` inherits these; they run in process (no Spark) against the
connector's real destination. The Spark route of the same rule is
``test_at_least_once_task_killed_then_replayed_with_fewer_partitions``.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any

import pyarrow as pa
import pytest

from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.faults import FaultPlan, InjectedCrash, InjectedTaskFailure
from sparkeos.core.protocol import TransactionalSink
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.streaming.identity import of_foreach_batch, of_running_query

from ..formatroute import FormatRoute
from ..inprocess import ArrowRunner, id_batch
from .support import REPLAY_RULE, assert_exactly_once

CRASHED = {0: [[1, 2], [3, 4], [5, 6]], 1: [[7, 8], [9, 10]]}
"""What the run that crashed gave each partition of batches 0 and 1."""
REPLAYED = {0: [[1, 2, 3], [4, 5, 6]], 1: [[10], [7], [8, 9]]}
"""The same rows, replayed on fewer (batch 0) and on more (batch 1) partitions, so
that no partition of the replay holds what the crashed run's partition of that
number held."""
CRASH_POINTS = {0: "after_all_prepared", 1: "after_first_commit"}
"""Exactly-once: batch 0 dies in phase 1, batch 1 in phase 2."""


class ReplayCases:
    """Mixed into ``ConnectorConformance`` (which provides the helpers used here)."""

    IN_PROCESS_SINK: str

    def sink_factory(self, workdir: str) -> TransactionalSink[Any]:
        raise NotImplementedError

    def visible_ids(self, workdir: str) -> list[int]:
        raise NotImplementedError

    def in_process_key(self, workdir: str) -> str:
        raise NotImplementedError

    def in_process_coordinator(self, workdir: str, faults: FaultPlan | None = None,
                               sink: TransactionalSink[Any] | None = None,
                               ) -> tuple[TransactionalSink[Any], Coordinator]:
        raise NotImplementedError

    def assert_no_leftovers(self, workdir: str) -> None:
        raise NotImplementedError

    def offers(self, workdir: str, guarantee: Guarantee) -> bool:
        return guarantee in self.sink_factory(workdir).guarantees

    # -- the cases ---------------------------------------------------------------------------
    def test_exactly_once_replay_partitioned_otherwise(self, workdir: str) -> None:
        """The driver dies in phase 1 of batch 0 (3 partitions) and in phase 2 of batch
        1 (2 partitions); each restart replays the batch on another partition count (2,
        then 3). Every row exactly once, nothing left prepared or staged."""
        if not self.offers(workdir, Guarantee.EXACTLY_ONCE):
            pytest.skip("the connector does not offer exactly_once")
        sink = self.sink_factory(workdir)
        for batch_id, point in CRASH_POINTS.items():
            crashing = self.replay_route(workdir, Guarantee.EXACTLY_ONCE, sink,
                                         FaultPlan(point, batch_id, simulate=True))
            with pytest.raises(InjectedCrash):
                crashing.run_batch(batch_id, _runner(CRASHED[batch_id]))
            restarted = self.replay_route(workdir, Guarantee.EXACTLY_ONCE, sink)
            restarted.run_batch(batch_id, _runner(REPLAYED[batch_id]))
        self.recover_route(workdir, sink)
        assert_exactly_once(self.visible_ids(workdir), list(range(1, 11)))
        self.assert_no_leftovers(workdir)

    def test_at_least_once_replay_partitioned_otherwise_loses_nothing(self,
                                                                       workdir: str) -> None:
        """Under ``at_least_once`` the last task of a batch fails for good after the
        others committed; the restart replays the batch on fewer partitions (batch 0),
        then on more (batch 1). No row may be missing; rows may repeat."""
        if not self.offers(workdir, Guarantee.AT_LEAST_ONCE):
            pytest.skip("the connector does not offer at_least_once")
        sink = self.sink_factory(workdir)
        for batch_id in CRASHED:
            with pytest.raises(InjectedTaskFailure):
                self.replay_route(workdir, Guarantee.AT_LEAST_ONCE, sink).run_batch(
                    batch_id, _runner(CRASHED[batch_id], fail_last=True))
            committed = set(self.visible_ids(workdir))
            assert committed, "the tasks before the failing one committed nothing"
            self.replay_route(workdir, Guarantee.AT_LEAST_ONCE, sink).run_batch(
                batch_id, _runner(REPLAYED[batch_id]))
            missing = sorted(set(_ids(CRASHED, batch_id + 1)) - set(self.visible_ids(workdir)))
            assert not missing, (f"batch {batch_id} replayed on another partition count "
                                 f"lost ids {missing}: {REPLAY_RULE}")
        self.assert_no_leftovers(workdir)

    def test_at_least_once_replay_partitioned_as_before_loses_nothing(self,
                                                                      workdir: str) -> None:
        """The same failure, replayed on the same partitions: nothing missing (a
        connector that deduplicates replays writes each row once)."""
        self._replay_half_written_batch(workdir, CRASHED[0])
        self.assert_no_leftovers(workdir)

    def test_a_switch_to_exactly_once_over_a_half_written_batch(self, workdir: str) -> None:
        """A query ran ``at_least_once`` and died with batch 0 half written; it restarts
        under ``exactly_once`` (same query, same sink name) on fewer partitions. Nothing
        of batch 0 may be lost (rows the two runs both wrote may repeat), and the batches
        after it are exactly once."""
        if not (self.offers(workdir, Guarantee.AT_LEAST_ONCE)
                and self.offers(workdir, Guarantee.EXACTLY_ONCE)):
            pytest.skip("the connector does not offer both guarantees")
        sink = self.sink_factory(workdir)
        with pytest.raises(InjectedTaskFailure):
            self.replay_route(workdir, Guarantee.AT_LEAST_ONCE, sink).run_batch(
                0, _runner(CRASHED[0], fail_last=True))
        exactly = self.replay_route(workdir, Guarantee.EXACTLY_ONCE, sink)
        exactly.run_batch(0, _runner(REPLAYED[0]))
        self.replay_route(workdir, Guarantee.EXACTLY_ONCE, sink).run_batch(
            1, _runner(CRASHED[1]))
        visible = self.visible_ids(workdir)
        missing = sorted(set(_ids(CRASHED, 2)) - set(visible))
        assert not missing, f"lost ids {missing}: {REPLAY_RULE}"
        later = [i for i in visible if i in _ids(CRASHED, 2)[6:]]
        assert sorted(later) == [7, 8, 9, 10], f"batch 1 not exactly once: {later}"
        self.recover_route(workdir, sink)
        self.assert_no_leftovers(workdir)

    def test_at_least_once_replay_shuffled_writes_nothing_again(self, workdir: str) -> None:
        """A shuffle upstream hands each partition of the replay the same rows in
        another order: by the replay rule (a fingerprint of the multiset of rows) no
        participant is rewritten, and none is lost."""
        metrics = self._replay_half_written_batch(
            workdir, [list(reversed(part)) for part in CRASHED[0]])
        assert metrics.replays_rewritten == 0, (
            f"{metrics.replays_rewritten} participants holding the same rows in another "
            f"order were written again: {REPLAY_RULE}")
        if metrics.replays_skipped:  # a connector that deduplicates replays
            assert_exactly_once(self.visible_ids(workdir), _ids(CRASHED, 1))
        self.assert_no_leftovers(workdir)

    def _replay_half_written_batch(self, workdir: str, replayed: list[list[int]]) -> Any:
        """Under ``at_least_once`` batch 0's last task fails for good after the others
        committed; the restart replays it as ``replayed``: nothing may be missing. The
        replay's metrics."""
        if not self.offers(workdir, Guarantee.AT_LEAST_ONCE):
            pytest.skip("the connector does not offer at_least_once")
        sink = self.sink_factory(workdir)
        with pytest.raises(InjectedTaskFailure):
            self.replay_route(workdir, Guarantee.AT_LEAST_ONCE, sink).run_batch(
                0, _runner(CRASHED[0], fail_last=True))
        metrics = self.replay_route(workdir, Guarantee.AT_LEAST_ONCE, sink).run_batch(
            0, _runner(replayed))
        missing = sorted(set(_ids(CRASHED, 1)) - set(self.visible_ids(workdir)))
        assert not missing, f"lost ids {missing}: {REPLAY_RULE}"
        return metrics

    def test_at_least_once_queries_are_told_apart_by_spark_query_id(self,
                                                                    workdir: str) -> None:
        """Two at-least-once queries with the same sink name, each with its checkpoint
        set only in the session (``spark.sql.streaming.checkpointLocation``: the format
        never sees it; foreachBatch under Spark Connect neither), one after the other:
        the first writes batches 0 to 3, the second 0 and 1. Every row of both arrives
        (the second query's batches must never be taken for replays of the first's,
        whose markers stand at later batches). A query with no identity at all
        (Connect, no checkpoint_location) writes a replayed batch again."""
        if not self.offers(workdir, Guarantee.AT_LEAST_ONCE):
            pytest.skip("the connector does not offer at_least_once")
        sink = self.sink_factory(workdir)
        queries = {"first": ([[1, 2], [3]], 4), "second": ([[4], [5, 6]], 2)}
        expected: list[int] = []
        for query, (partitions, batches) in queries.items():
            route = self.unidentified_route(workdir, sink, query)
            for batch_id in range(batches):
                rows = [[10 * batch_id + i for i in part] for part in partitions]
                route.run_batch(batch_id, _runner(rows))
                expected += [i for part in rows for i in part]
            missing = sorted(set(expected) - set(self.visible_ids(workdir)))
            assert not missing, (f"query {query!r} lost ids {missing}: two queries were "
                                 "taken for one")
        if self.route == "format":
            return
        # No durable identity: a replay is written again, never skipped.
        for _run in range(2):
            metrics = self.unidentified_route(workdir, sink, None).run_batch(
                0, _runner([[101, 102], [103]]))
            assert metrics.replays_skipped == 0, (
                "a query without a durable identity skipped a batch as a replay")
        assert {101, 102, 103} <= set(self.visible_ids(workdir))

    # -- the routes ----------------------------------------------------------------------------
    route: str = "foreachBatch"

    def format_spec(self, workdir: str) -> dict[str, Any]:
        raise NotImplementedError

    def format_rows(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The stream's rows as the format gets them (``format_spec``'s ``select``,
        which Spark would run): the input rows themselves by default."""
        return batch

    def replay_route(self, workdir: str, guarantee: Guarantee, sink: TransactionalSink[Any],
                     faults: FaultPlan | None = None) -> Any:
        """A query run under ``guarantee`` through this class's route, in process: the
        foreachBatch route's coordinator (on ``sink``), or the format's three calls
        (``sparkeos.testing.formatroute``; the format makes its own sink)."""
        if self.route == "format":
            spec = self.format_spec(workdir)
            return FormatRoute(spec["format"], dict(spec["options"]),
                               os.path.join(workdir, "format-checkpoint"),
                               self.IN_PROCESS_SINK, guarantee, self.format_rows, faults)
        if guarantee is Guarantee.EXACTLY_ONCE:
            return self.in_process_coordinator(workdir, faults, sink=sink)[1]
        config = CoordinatorConfig(name=self.IN_PROCESS_SINK, guarantee=guarantee)
        return Coordinator(sink, config, None, self.in_process_key(workdir), faults)

    def unidentified_route(self, workdir: str, sink: TransactionalSink[Any],
                           query: str | None) -> Any:
        """An at-least-once run of query ``query`` (a Spark query ID; None: none
        readable) whose checkpoint reaches sparkeos only as Spark's tasks and running
        query report it: the format without a ``checkpointLocation`` option, the
        foreachBatch route's identity rule (``core.streaming.identity``) under Spark Connect."""
        if self.route == "format":
            spec = self.format_spec(workdir)
            query_id = str(uuid.uuid5(uuid.NAMESPACE_URL, str(query)))
            return FormatRoute(spec["format"], dict(spec["options"]),
                               os.path.join(workdir, f"format-checkpoint-{query}"),
                               self.IN_PROCESS_SINK, Guarantee.AT_LEAST_ONCE,
                               self.format_rows, query_id=query_id,
                               checkpoint_option=False)
        known = of_foreach_batch(None, None) if query is None else of_running_query(query)
        config = CoordinatorConfig(name=self.IN_PROCESS_SINK,
                                   guarantee=Guarantee.AT_LEAST_ONCE)
        return Coordinator(sink, config, None, known.key, durable_identity=known.durable)

    def recover_route(self, workdir: str, sink: TransactionalSink[Any]) -> None:
        """A restarted query's full recovery, on the route's commit log."""
        if self.route == "format":
            route = self.replay_route(workdir, Guarantee.EXACTLY_ONCE, sink)
            route.recover(self.format_rows(id_batch([0])).schema)
            return
        with contextlib.suppress(InjectedCrash):
            self.in_process_coordinator(workdir, sink=sink)[1].recover(full=True)


def _runner(partitions: list[list[int]], fail_last: bool = False) -> ArrowRunner:
    """One task per partition, no retries; with ``fail_last`` the last partition's task
    fails for good after the others committed (they run first, in order)."""
    last = len(partitions) - 1

    def fail(partition: int, attempt: int) -> None:
        if partition == last:
            raise InjectedTaskFailure(f"partition {partition} fails for good")

    return ArrowRunner([id_batch(ids) for ids in partitions], max_attempts=1,
                       before_attempt=fail if fail_last else None)


def _ids(plan: dict[int, list[list[int]]], batches: int) -> list[int]:
    return [i for b in range(batches) for part in plan[b] for i in part]


__all__ = ["REPLAY_RULE", "ReplayCases"]
