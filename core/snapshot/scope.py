"""What every part of a coordinator shares: one sink (or the members of a sink group)
under one guarantee, its configuration, the commit log with the batch states read from
it, the transaction pool and the fault plan.

It also owns the few commit-log operations the batch protocol and recovery both use:
settling a run's outcome (first writer wins), naming the decided run's transactions,
and purging records older than the retention window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import ConfigurationError
from sparkeos.core.faults import FaultPlan
from sparkeos.core.protocol import Receipt, TransactionalSink

from .commitlog import OUTCOME, BatchState, CommitLog
from .committers import Unit, committer_of, units
from .group import SINGLE
from .txpool import Transaction, TransactionPool


@dataclass
class Scope:
    """The members (a single sink is the member ``SINGLE``), bound to their guarantee."""

    members: dict[str, TransactionalSink[Any]]
    grouped: bool
    config: CoordinatorConfig
    log: CommitLog | None
    pool: TransactionPool
    faults: FaultPlan
    _states: dict[int, BatchState] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.config.name

    def require_log(self) -> CommitLog:
        if self.log is None:
            raise ConfigurationError("this coordinator has no commit log", sink=self.name)
        return self.log

    def load_states(self) -> dict[int, BatchState]:
        """The batches on record, read once and then kept up to date in memory."""
        if self._states is None:
            self._states = self.require_log().batches()
        return self._states

    def forget_states(self) -> None:
        """After a failure the memory may be behind the log: read it again next time."""
        self._states = None

    def settle(self, state: BatchState, run: int, outcome: dict[str, Any]) -> dict[str, Any]:
        """Record ``outcome`` for ``run`` unless another process recorded one first;
        return the outcome that holds."""
        held = self.require_log().claim(state.batch_id, OUTCOME, outcome, run)
        state.outcomes[run] = held
        return held

    def decided_transactions(
        self, state: BatchState
    ) -> list[tuple[str, Transaction, Receipt]]:
        """(member, transaction, receipt) of every decided participant."""
        run = state.decided_run
        assert run is not None and state.decided is not None
        return [
            (str(p.get("member", SINGLE)),
             self.pool.transaction(state.batch_id, int(p["partition"]), run, int(p["tag"])),
             p["receipt"])
            for p in state.decided["participants"]
        ]

    def decided_units(self, state: BatchState, member: str) -> list[Unit]:
        """The decided participants of ``member`` as the decision grouped them for
        their commits (``core.snapshot.committers``)."""
        run = state.decided_run
        assert run is not None and state.decided is not None
        return units([
            (self.pool.transaction(state.batch_id, int(p["partition"]), run, int(p["tag"])),
             p["receipt"], committer_of(p))
            for p in state.decided["participants"]
            if str(p.get("member", SINGLE)) == member
        ])

    def purge(self, batch_id: int) -> None:
        """Drop the records of batches older than the retention window (an unresolved
        one stays in memory: recovery still has to finish it)."""
        keep_from = batch_id - self.config.retain_batches
        states = self.load_states()
        old = [s for b, s in states.items() if b < keep_from]
        if old:
            self.require_log().purge_before(keep_from, old)
            for s in old:
                if not s.unresolved:
                    states.pop(s.batch_id, None)

    def fields(self, batch_id: int) -> dict[str, Any]:
        """The fields every log event of a batch carries."""
        return {"query": self.pool.query_key, "sink": self.name, "batch": batch_id}
