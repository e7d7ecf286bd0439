"""The five concurrency bugs of issue 7, put back one at a time (``--mutant NAME``).

Each mutant restores what the code did before its fix; the model check must find a
violation under every one of them, which shows the check can fail where it should.

=============================  ======================================================
``shared-attempt-ids``         bug 1: every attempt of a task uses the same ID and
                               ``begin`` fences the earlier attempt by rolling back
                               what is prepared under it
``last-run-only``              bug 2: recovery rolls back the IDs of a batch's last
                               run only (as planned by its partition count), so an
                               attempt of an earlier run that prepares late, after
                               a re-run with fewer partitions, stays forever
``last-outcome-wins``          bug 3: a run's outcome record is overwritten, so a
                               racing recover and the driver both think they won
``no-name-claim``              bug 4: two sinks of one query may share a name
``schema-pinned-before-validate``  bug 5: the schema is recorded before the sink
                               validates the batch
=============================  ======================================================
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from sparkeos.core.snapshot import tasks as tasks_mod
from sparkeos.core.snapshot.checks import PreDecisionChecks
from sparkeos.core.snapshot.commitlog import OUTCOME, CommitLog, record_name
from sparkeos.core.snapshot.recovery import Recovery
from sparkeos.core.streaming import adapter as adapter_mod

from .system import ModelSink


@contextlib.contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


@contextlib.contextmanager
def shared_attempt_ids() -> Iterator[None]:
    original_begin = ModelSink.begin

    def fencing_begin(self: Any, txn: Any) -> Any:
        held = self.system.held.get(txn.txn_id)
        if held is not None:  # "fence the earlier attempt": undo what it holds
            self.system.held.pop(txn.txn_id)
            if held.state == "open":
                self.system.fenced.add(txn.txn_id)
            self.system.changed()
        return original_begin(self, txn)

    with _patched(tasks_mod, "attempt_tag", lambda attempt, task_attempts: 0), \
            _patched(ModelSink, "begin", fencing_begin):
        yield


@contextlib.contextmanager
def last_run_only() -> Iterator[None]:
    original_sweep = Recovery.sweep

    def sweep(self: Recovery, states: Any, *, quiet: bool = False) -> None:
        newest = []
        for state in states:
            last = state.last_attempt
            copy = dataclasses.replace(
                state, begun={r: b for r, b in state.begun.items() if r == last})
            newest.append(copy)
        original_sweep(self, newest, quiet=quiet)

    with _patched(Recovery, "sweep", sweep):
        yield


@contextlib.contextmanager
def last_outcome_wins() -> Iterator[None]:
    original_claim = CommitLog.claim

    def claim(self: CommitLog, batch_id: int, kind: str, payload: Any,
              run: int | None = None) -> Any:
        if kind != OUTCOME:
            return original_claim(self, batch_id, kind, payload, run)
        body = {"batch_id": batch_id, "kind": kind, "run": run, **payload}
        import json

        self.store.replace(record_name(batch_id, kind, run), json.dumps(body).encode())
        return body

    with _patched(CommitLog, "claim", claim):
        yield


@contextlib.contextmanager
def no_name_claim() -> Iterator[None]:
    with _patched(adapter_mod, "claim_sink_name", lambda *args: None):
        yield


@contextlib.contextmanager
def schema_pinned_before_validate() -> Iterator[None]:
    original_check = PreDecisionChecks.check_schema
    original_validate = ModelSink.validate

    def check(self: PreDecisionChecks, batch_id: int, schemas: Any) -> None:
        if not self.recorded_schemas():
            self.pin_on_decision(schemas)  # pinned first, as before the fix
        original_check(self, batch_id, schemas)
        for member, part in self.scope.members.items():
            original_validate(part, schemas[member])  # type: ignore[arg-type]

    with _patched(PreDecisionChecks, "check_schema", check), \
            _patched(ModelSink, "validate", lambda self, schema: None):
        yield


MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "shared-attempt-ids": shared_attempt_ids,
    "last-run-only": last_run_only,
    "last-outcome-wins": last_outcome_wins,
    "no-name-claim": no_name_claim,
    "schema-pinned-before-validate": schema_pinned_before_validate,
}
