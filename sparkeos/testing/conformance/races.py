"""Conformance cases for what runs beside a commit: a second committer of the same
transaction (the driver and ``sparkeos recover --force``, a retried call that went
through), a task retried beside a dead attempt's prepared state after the query ran for
days, and ``at_least_once`` after a task was killed mid-write.

``ConnectorConformance`` inherits these; a connector gets them by naming the steps of
its commit (``commit_steps`` and ``core.steps.commit_step``, see
docs/writing-a-connector.md).
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from sparkeos.core.config import CoordinatorConfig, Guarantee
from sparkeos.core.errors import DataLossError
from sparkeos.core.faults import FaultPlan, InjectedCrash
from sparkeos.core.protocol import Receipt, Transaction, TransactionalSink
from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
from sparkeos.core.snapshot.committers import Unit
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.snapshot.group import SINGLE
from sparkeos.core.storage.logstores import open_store

from ..inprocess import ArrowRunner, ListRunner, OneProcessRunner, id_batch
from ..interleave import PairOutcome, commit_beside, commit_pair
from .support import assert_exactly_once

RACE_SINK = "race"
FAR_BATCH = 1_000_000
"""A batch ID past every retention horizon of the built-in connectors (PostgreSQL keeps
1,000 batches of marker rows, the commit log 100)."""


class RaceCases:
    """Mixed into ``ConnectorConformance`` (which provides the helpers used here)."""

    far_batch_id = FAR_BATCH

    # -- provided by ConnectorConformance --------------------------------------------------------
    IN_PROCESS_SINK: str

    def sink_factory(self, workdir: str) -> TransactionalSink[Any]:
        raise NotImplementedError

    def visible_ids(self, workdir: str) -> list[int]:
        raise NotImplementedError

    def finish(self, workdir: str, sink: TransactionalSink[Any], expected: list[int]) -> None:
        raise NotImplementedError

    def in_process_coordinator(self, workdir: str, faults: FaultPlan | None = None,
                               sink: TransactionalSink[Any] | None = None,
                               ) -> tuple[TransactionalSink[Any], Coordinator]:
        raise NotImplementedError

    def attempt(self, coord: Coordinator, batch_id: int, partition: int, tag: int,
                run: int = 0) -> Transaction:
        raise NotImplementedError

    def assert_no_leftovers(self, workdir: str) -> None:
        raise NotImplementedError

    # -- helpers -------------------------------------------------------------------------------
    def commit_steps_or_skip(self, workdir: str) -> tuple[str, ...]:
        points = tuple(self.sink_factory(workdir).commit_steps)
        if not points:
            pytest.skip("the connector names no steps of its commit (commit_steps)")
        return points

    def decided_not_committed(self, workdir: str, log: CommitLog, key: str, batch_id: int,
                              ids: list[int]) -> tuple[Transaction, Receipt]:
        """Batch ``batch_id`` of one participant writing ``ids``, decided, then the
        driver dies before phase 2: what two committers race to finish."""
        unit = self.decided_unit_not_committed(workdir, log, key, batch_id, [ids])
        return unit[0]

    def decided_unit_not_committed(self, workdir: str, log: CommitLog, key: str,
                                   batch_id: int, partitions: list[list[int]]) -> Unit:
        """Batch ``batch_id`` of ``partitions``, decided with one committer for all of
        them (``commit_parallelism=1`` and phase 2 in one process, as in the format
        route: a sink that ``merges_commits`` commits them together), then the driver
        dies before phase 2. The decided participants as
        the decision grouped them: one unit."""
        config = CoordinatorConfig(name=RACE_SINK, commit_parallelism=1)
        coord = Coordinator(self.sink_factory(workdir), config, log, key,
                            FaultPlan("after_decided", batch_id, simulate=True))
        with pytest.raises(InjectedCrash):
            coord.run_batch(batch_id, OneProcessRunner(partitions))
        state = coord.states()[batch_id]
        assert state.decided is not None and state.decided_run is not None
        units = coord.scope.decided_units(state, SINGLE)
        assert len(units) == 1, f"batch {batch_id} was decided in {len(units)} units"
        return units[0]

    def race_partitions(self, workdir: str, ids: list[int]) -> list[list[int]]:
        """The partitions of a raced batch: one participant, or two where the sink
        merges commits (the race is then between two commits of both at once)."""
        if self.sink_factory(workdir).merges_commits():
            return [ids[:1], ids[1:]]
        return [ids]

    def race_log(self, workdir: str) -> tuple[str, CommitLog, str]:
        """A checkpoint whose commit log records this sink as the adapter would, so
        ``sparkeos recover`` can rebuild it: (checkpoint, log, query key)."""
        from sparkeos.core.streaming.adapter import ForeachBatchAdapter

        checkpoint = os.path.join(workdir, "race-checkpoint")
        log = CommitLog(open_store(sink_log_location(checkpoint, RACE_SINK)))
        adapter = ForeachBatchAdapter(self.sink_factory(workdir),
                                      CoordinatorConfig(name=RACE_SINK))
        return checkpoint, log, adapter._claim_log(log, f"race:{workdir}")

    def recover_settings(self, workdir: str) -> dict[str, str]:
        """What ``sparkeos recover`` must be given with ``--set`` to rebuild the sink
        (secrets are never recorded). Default: its secret fields that hold text."""
        sink = self.sink_factory(workdir)
        settings = {}
        for name in sorted(sink.secret_fields):
            value = getattr(sink, name, None)
            if isinstance(value, str) and value:
                settings[name] = value
        return settings

    def recover_command(self, workdir: str, checkpoint: str) -> list[str]:
        """``sparkeos recover --force`` for the race checkpoint."""
        sets = [arg for key, value in self.recover_settings(workdir).items()
                for arg in ("--set", f"{key}={value}")]
        return [sys.executable, "-m", "sparkeos.cli", "recover", "--force", checkpoint,
                *sets]

    def settle(self, workdir: str, log: CommitLog, key: str, expected: list[int]) -> None:
        """A restarted driver's full recovery, then every id once and nothing left."""
        Coordinator(self.sink_factory(workdir), CoordinatorConfig(name=RACE_SINK), log,
                    key).recover(full=True)
        assert_exactly_once(self.visible_ids(workdir), expected)
        self.assert_no_leftovers(workdir)

    # -- the cases ---------------------------------------------------------------------------------
    def test_two_commits_of_one_transaction_at_every_pair_of_steps(self, workdir: str
                                                                   ) -> None:
        """The driver's phase 2 and a recovering committer (``recover --force``, a
        second driver) commit the same decided transaction at once. The first is held at
        each step of the connector's commit while the second runs to each step, or to its
        end: every pair of positions. Neither may fail (no ``DataLossError``, no
        "missing"), every row lands once, nothing is left behind."""
        points = self.commit_steps_or_skip(workdir)
        _, log, key = self.race_log(workdir)
        expected: list[int] = []
        seen: Counter[str] = Counter()
        trials = [(x, y) for x in points for y in (*points, None)]
        for batch_id, (first_at, second_at) in enumerate(trials):
            ids = [batch_id * 10 + 1, batch_id * 10 + 2]
            unit = self.decided_unit_not_committed(workdir, log, key, batch_id,
                                                   self.race_partitions(workdir, ids))
            driver, twin = self.sink_factory(workdir), self.sink_factory(workdir)
            outcome = commit_pair(committing(driver, unit, recovering=False),
                                  committing(twin, unit, recovering=True),
                                  first_at, second_at)
            _no_errors(outcome)
            seen[outcome.second] += 1
            expected += ids
        self.settle(workdir, log, key, expected)
        assert seen, "no interleaving ran"

    def test_a_commit_racing_recover_force_from_the_cli(self, workdir: str) -> None:
        """``sparkeos recover --force`` (another process) finishes a decided batch while
        the driver's commit of it is held at each step of the connector's commit."""
        points = self.commit_steps_or_skip(workdir)
        checkpoint, log, key = self.race_log(workdir)
        command = self.recover_command(workdir, checkpoint)
        expected: list[int] = []
        for batch_id, first_at in enumerate(points):
            ids = [batch_id * 10 + 1, batch_id * 10 + 2]
            unit = self.decided_unit_not_committed(workdir, log, key, batch_id,
                                                   self.race_partitions(workdir, ids))
            driver = self.sink_factory(workdir)
            outcome, output = commit_beside(committing(driver, unit, recovering=False),
                                            first_at, command)
            _no_errors(outcome)
            assert f"batch {batch_id} committed" in output, output
            expected += ids
        self.settle(workdir, log, key, expected)

    def test_a_retry_beside_a_dead_prepared_attempt_past_every_retention_horizon(
            self, workdir: str) -> None:
        """A query that ran for days (batch IDs past every retention horizon, so its
        first batches' bookkeeping is being purged): partition 0's first attempt
        prepared and its executor died; the retry must prepare at once, not wait on
        what the dead attempt holds until a lock timeout fails the batch."""
        sink, coord = self.in_process_coordinator(workdir)
        coord.run_batch(0, ListRunner([[1], [2], [3], [4]]))  # bookkeeping to purge
        far = self.far_batch_id
        dead = sink.begin(self.attempt(coord, far, 0, tag=0))
        sink.write(dead, id_batch([999_999]))
        sink.prepare(dead)  # ... and its executor is gone
        coord.run_batch(far, ArrowRunner([id_batch([5]), id_batch([6])],
                                         first_attempt={0: 1}))
        decided = coord.states()[far].decided
        assert decided is not None and decided["participants"][0]["tag"] == 1
        coord.run_batch(far + 1, ListRunner([[7], [8]]))
        self.finish(workdir, sink, [1, 2, 3, 4, 5, 6, 7, 8])

    def test_commit_after_a_twin_finished_is_never_data_loss(self, workdir: str) -> None:
        """The plainest race, without holding anyone: a commit that starts after its
        twin committed and cleaned up finds the work done, never "lost"."""
        _, log, key = self.race_log(workdir)
        txn, receipt = self.decided_not_committed(workdir, log, key, 0, [1, 2])
        self.sink_factory(workdir).commit(txn, receipt)
        try:
            self.sink_factory(workdir).recover_commit(txn, receipt)
        except DataLossError as exc:  # pragma: no cover - the failure this case is for
            raise AssertionError(f"a finished commit read as lost: {exc}") from exc
        self.settle(workdir, log, key, [1, 2])

    def at_least_once_supported(self, workdir: str) -> bool:
        return Guarantee.AT_LEAST_ONCE in self.sink_factory(workdir).guarantees


def committing(sink: TransactionalSink[Any], unit: Unit, *,
               recovering: bool) -> Callable[[], None]:
    """A commit of ``unit`` as phase 2 (``recovering=False``) or a recovery runs it."""
    if len(unit) > 1:
        return partial(sink.commit_merged, unit, recovering=recovering)
    txn, receipt = unit[0]
    return partial(sink.recover_commit if recovering else sink.commit, txn, receipt)


def _no_errors(outcome: PairOutcome) -> None:
    assert not outcome.errors, (
        f"held at {outcome.first_at!r}, the other at {outcome.second_at!r} "
        f"({outcome.second}): " + "; ".join(f"{role}: {type(e).__name__}: {e}"
                                            for role, e in outcome.errors.items()))


__all__ = ["FAR_BATCH", "RaceCases"]
