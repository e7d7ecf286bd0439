"""Recovery, phase 2 and sweeps: everything that finishes or rolls back what the
commit log says, for the batch protocol and for ``sparkeos recover`` alike.

Only the coordinator rolls back prepared state, and only for runs whose outcome is on
record (``aborted``, or ``decided`` for every attempt it does not name): a task's
``abort`` touches its own attempt's writes, never another's.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sparkeos.core.errors import ConfigurationError, SparkStoppedError, describe_cause
from sparkeos.core.observe import log_event
from sparkeos.core.protocol import CommitLocation

from .commitlog import ABORTED, FINISHED, BatchState
from .committers import Unit
from .scope import Scope
from .tasks import BatchRunner, CommitTask
from .txpool import AttemptRange


class Recovery:
    """Recovery and sweeps of one coordinator; it remembers which sweeps it has done."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.swept_all = False
        self.direct_swept = False

    def recover(self, runners: Mapping[str, BatchRunner], *,
                full: bool | None = None,
                guard: Callable[[], None] | None = None,
                skip: frozenset[int] = frozenset()) -> list[dict[str, Any]]:
        """Finish decided batches, abort runs left without an outcome, sweep leftovers
        (``Coordinator.recover`` says when ``full`` sweeps everything). ``guard`` runs
        after the log was read and before the first run is aborted, and may refuse by
        raising (an operator's recover checks there that no running query holds the
        lease: a run begun by a live query was begun after its lease was written).
        ``skip``: decided batches this process is committing in the background."""
        states = self.scope.load_states()
        full = not self.swept_all if full is None else full
        done: list[dict[str, Any]] = []
        if guard is not None and any(s.open_runs for s in states.values()):
            guard()
        for state in sorted(states.values(), key=lambda s: s.batch_id):
            for run in state.open_runs:
                held = self.scope.settle(state, run, {"outcome": ABORTED,
                                                      "reason": "recovery"})
                if held.get("outcome") == ABORTED:
                    log_event("recovery.aborted", **self.scope.fields(state.batch_id),
                              run=run, partitions=state.begun[run].get("partitions"))
                    done.append({"batch_id": state.batch_id, "action": "rolled_back"})
                    if not full:
                        self.sweep([state])
            if state.needs_commit and state.batch_id not in skip:
                self.commit_decided(state, runners, recovering=True)
                done.append({"batch_id": state.batch_id, "action": "committed"})
        if full:
            self.sweep(states.values())
            self.swept_all = True
        return done

    def commit_decided(
        self, state: BatchState, runners: Mapping[str, BatchRunner], *, recovering: bool
    ) -> None:
        log = self.scope.require_log()
        assert state.decided is not None
        decided = self.scope.decided_transactions(state)
        unknown = sorted({member for member, _t, _r in decided} - set(self.scope.members))
        if unknown:
            raise ConfigurationError(
                f"batch {state.batch_id} was decided with members {unknown}, which this "
                "query does not have: every member of a decided batch must be committed",
                sink=self.scope.name, batch_id=state.batch_id,
                fix="restart the query with the members it had (members can be added or "
                "removed once every decided batch is finished)")
        first = True
        for member, part in self.scope.members.items():
            items = self.scope.decided_units(state, member)
            if not items:
                continue
            runner = runners.get(member)
            # Recovery commits in this process too: the first Spark job of a restarted
            # application waits for a Python worker to start (about 2 s), longer than
            # publishing what one crashed batch staged.
            in_tasks = (part.commit_location is CommitLocation.TASKS and runner is not None
                        and not recovering)
            commit = CommitTask(part, recovering, self.scope.faults, in_tasks)
            if runner is not None and in_tasks:
                try:
                    runner.run_in_tasks(commit, items)
                except SparkStoppedError:
                    # Spark stopped under the commit (the script's end beside a batch
                    # committing in the background): finish it here, as recovery does,
                    # which is safe after tasks that committed some participants.
                    log_event("batch.commit_on_driver", **self.scope.fields(state.batch_id),
                              member=member, reason="spark_stopped")
                    self.commit_on_driver(CommitTask(part, True, self.scope.faults), items,
                                          state.batch_id, first)
            else:
                # In this process: sinks that commit on the driver, and sinks that commit
                # in tasks when there is no Spark at hand (`sparkeos recover`, the format
                # route's commit) or when recovering, which must reach the staged data (a
                # shared directory or HDFS), else the sink says which host holds it.
                self.commit_on_driver(commit, items, state.batch_id, first)
            first = False
        self.scope.faults.driver("after_all_commits", state.batch_id)
        state.finished = log.claim(state.batch_id, FINISHED, {
            "participants": len(decided), "rows": state.decided.get("rows", 0),
            "recovered": recovering})
        if recovering:
            log_event("recovery.committed", **self.scope.fields(state.batch_id),
                      participants=len(decided))
        self.scope.faults.driver("after_finished", state.batch_id)
        # The batch is committed whatever happens here; leftovers a failing sweep leaves
        # are swept again when the slot is reused and on the next recovery.
        self.sweep([state], quiet=True)

    def commit_on_driver(
        self, commit: CommitTask, items: list[Unit], batch_id: int, first_member: bool,
    ) -> None:
        """Every unit at once on ``commit_parallelism`` threads. With a fault planned
        after the first commit, the first runs alone before the others, so the point
        falls exactly there (the fault injection tests read that state)."""
        faults = self.scope.faults
        in_order = first_member and faults.plans("after_first_commit", batch_id)
        workers = min(self.scope.config.commit_parallelism, len(items))
        if workers == 1 or in_order:
            commit(items[0])
            if first_member:
                faults.driver("after_first_commit", batch_id)
            items, first_member = items[1:], False
            if workers == 1 or len(items) < 2:
                for item in items:
                    commit(item)
                return
        # Each commit runs in a copy of this thread's context: what the caller set there
        # (the store locations a format carries) is its threads' too.
        caller = contextvars.copy_context()
        done = []
        with ThreadPoolExecutor(min(workers, len(items)),
                                thread_name_prefix="sparkeos-commit") as ex:
            try:
                for item in items:
                    done.append(ex.submit(caller.copy().run, commit, item))
            except RuntimeError:
                # The interpreter is exiting, and its exit waits for this commit:
                # no new threads then. The rest commits here, one after the other.
                log_event("batch.commit_in_order", **self.scope.fields(batch_id),
                          reason="interpreter_exiting", left=len(items) - len(done))
            if done:
                done[0].result()
                if first_member:
                    faults.driver("after_first_commit", batch_id)
                    first_member = False
            for future in done[1:]:
                future.result()
        for item in items[len(done):]:
            commit(item)
            if first_member:
                faults.driver("after_first_commit", batch_id)
                first_member = False

    def abort_run(self, state: BatchState, run: int, cause: BaseException) -> None:
        log_event("batch.aborting", **self.scope.fields(state.batch_id), run=run,
                  cause=describe_cause(cause))
        held = self.scope.settle(state, run, {"outcome": ABORTED,
                                              "reason": describe_cause(cause)})
        if held.get("outcome") == ABORTED:
            # The cause is what the user must see, not a failing sweep.
            self.sweep([state], quiet=True)

    def sweep(self, states: Iterable[BatchState], *, quiet: bool = False) -> None:
        """Roll back every transaction ID of the given batches that can never be
        committed: every run with an outcome, except the decided attempts.

        Every member sweeps the group's whole range with the group's decided IDs kept:
        a member's destination holds only its own IDs, and every other ID the range
        covers is doomed in every member alike.

        ``quiet``: log a failure instead of raising it (where the batch's fate is
        already settled; the next sweep of the same IDs tries again)."""
        ranges: list[AttemptRange] = []
        keep: set[str] = set()
        for state in states:
            for run, begun in state.begun.items():
                if run not in state.outcomes:
                    continue  # no outcome yet: it may still be decided
                ranges.append(AttemptRange(
                    self.scope.pool.query_key, self.scope.name, state.batch_id, run,
                    int(begun["partitions"]), int(begun.get("tags", 1))))
            if state.decided is not None:
                keep.update(txn.txn_id
                            for _m, txn, _r in self.scope.decided_transactions(state))
        if not ranges:
            return
        failures: list[Exception] = []
        for part in self.scope.members.values():
            try:
                part.sweep(ranges, frozenset(keep))
            except Exception as exc:
                failures.append(exc)
        if not failures:
            return
        if not quiet:
            raise failures[0]
        batches = sorted({r.batch_id for r in ranges})
        for failure in failures:
            log_event("sweep.failed", logging.WARNING, query=self.scope.pool.query_key,
                      sink=self.scope.name, batches=batches, cause=describe_cause(failure))

    def sweep_slot(self, batch_id: int, states: dict[int, BatchState]) -> None:
        """Before a batch reuses a slot, sweep the batch that used it before: late
        attempts of that batch may have prepared after its own sweep."""
        previous = states.get(batch_id - 2)
        if previous is not None and not previous.unresolved:
            self.sweep([previous])

    def sweep_direct(self, batch_id: int, partitions: int) -> None:
        """Before a query run's first batch (the one a crashed run died in, which Spark
        replays first): roll back what tasks of earlier runs left under this batch's IDs
        (a task killed mid-write leaves its claim or prepared state behind). Those runs
        are over, and a direct task's transaction is committed by the task itself or
        never, so this removes only what nobody will commit; it blocks nothing (this
        run's IDs are its own), it only cleans up. Connectors whose sweep lists what
        they hold find every earlier run; the default sweep, which names IDs, cannot."""
        ranges = [AttemptRange(self.scope.pool.query_key, self.scope.name, batch_id, 0,
                               partitions, self.scope.config.task_attempts,
                               any_direct_run=True)]
        for part in self.scope.members.values():
            part.sweep(ranges, frozenset())
        self.direct_swept = True
