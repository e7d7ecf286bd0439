"""The checks before a batch may be decided, and what the decision pins.

Before any task writes: the sinks judge the batch's schema, the schema must be the one
the sink has committed, and a sink whose log is new must not hold another query's
committed output under its name. Once a batch is decided, the schema and the
destination (``identity()``) are pinned in ``sink.json``; never before, so a batch that
was refused or failed cannot make the corrected query look changed.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import ConfigurationError, SchemaMismatchError, SparkEOSError
from sparkeos.core.observe import log_event

from .commitlog import IDENTITY_PINNED, CommitLog
from .group import SINGLE, SinkGroup
from .lease import driver_pid, lease_held
from .scope import Scope


class PreDecisionChecks:
    """The checks of one coordinator; it reads ``sink.json`` once and remembers it."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self._meta: dict[str, Any] | None = None
        self._existing_checked = False

    def before_writing(self, batch_id: int, schemas: Mapping[str, pa.Schema]) -> None:
        """Everything that must hold before the batch's first task writes."""
        # The sinks judge the schema first: a batch they refuse must not pin anything.
        for member, part in self.scope.members.items():
            part.validate(schemas[member])
        self.check_schema(batch_id, schemas)
        self.check_existing_output(batch_id)

    def recorded_meta(self) -> dict[str, Any]:
        if self._meta is None:
            self._meta = self.scope.require_log().read_meta() or {}
        return self._meta

    def recorded_schemas(self) -> dict[str, Any]:
        meta = self.recorded_meta()
        if self.scope.grouped:
            return dict(meta.get("schemas") or {})
        return {SINGLE: meta["schema"]} if "schema" in meta else {}

    def check_schema(self, batch_id: int, schemas: Mapping[str, pa.Schema]) -> None:
        recorded_all = self.recorded_schemas()
        for member, schema in schemas.items():
            recorded = recorded_all.get(member)
            current = schema_fields(schema)
            part = self.scope.members[member]
            if recorded is None or recorded == current or part.accepts_schema_change:
                continue
            before = {name: typ for name, typ in recorded}
            after = {name: typ for name, typ in current}
            changes = [f"+{n}:{t}" for n, t in after.items() if n not in before]
            changes += [f"-{n}:{t}" for n, t in before.items() if n not in after]
            changes += [f"{n}:{before[n]}->{t}" for n, t in after.items()
                        if n in before and before[n] != t]
            whose = f"member {member!r} of this sink group" if member != SINGLE else (
                "this sink")
            raise SchemaMismatchError(
                f"the batch's schema differs from the schema {whose} has committed: "
                + (", ".join(changes) or "column order changed"),
                sink=self.scope.name, batch_id=batch_id,
                fix="select/cast the DataFrame back to the recorded schema, or write the new "
                "schema under a new sink name; nothing of this batch was written",
            )

    def check_existing_output(self, batch_id: int) -> None:
        """Before a sink that never decided a batch writes: refuse to write again what
        another query (a lost checkpoint) committed under this sink name."""
        if self._existing_checked or self.scope.config.existing_output == "accept":
            return
        if self.recorded_meta().get(IDENTITY_PINNED):
            self._existing_checked = True
            return
        self.check_renamed_sink(batch_id)
        name = self.scope.name
        for part in self.scope.members.values():
            found = part.output_of_other_queries(self.scope.pool.query_key, name)
            if found:
                raise ConfigurationError(
                    f"{type(part).__name__} already holds committed output of sink name "
                    f"{name!r} written by another query ({found}), and this query's "
                    "commit log is new (a lost or different checkpoint): writing would put "
                    "those rows there twice",
                    sink=name, batch_id=batch_id,
                    fix="restore the checkpoint the output was written with; or start this "
                    "query where the old one stopped (e.g. a later startingOffsets) and pass "
                    "exactly_once(..., existing_output='accept'); or, to re-process on "
                    "purpose (the old rows stay), pass existing_output='accept'; or use "
                    "another sink name or destination. Nothing was written",
                )
        self._existing_checked = True

    def check_renamed_sink(self, batch_id: int) -> None:
        """Before a sink whose log is new writes batch N: another sink of this
        checkpoint, of the same type and destination, that decided batch N or later is
        most likely this sink under its old name. Its decided batches are committed by
        recovery (``sparkeos recover`` walks every sink of a checkpoint) and Spark
        replays them to the new name: writing them here would put them there twice."""
        log = self.scope.require_log()
        mine = self.recorded_meta()
        for name, other in ((n, CommitLog(s)) for n, s in log.store.siblings()
                            if n != self.scope.name):
            try:
                meta = other.read_meta() or {}
                if (meta.get("sink_type") != mine.get("sink_type")
                        or meta.get("identity") != mine.get("identity")
                        or held_by_this_process(other.read_lease())):
                    continue  # another destination, or a live sink of this very query
                decided = sorted(b for b, state in other.batches().items()
                                 if b >= batch_id and state.decided is not None)
            except SparkEOSError as exc:  # that log's own problem: its sink reports it
                log_event("check.sibling_unreadable", logging.WARNING,
                          sink=self.scope.name, other=name, cause=str(exc))
                continue
            if decided:
                raise ConfigurationError(
                    f"sink {self.scope.name!r} is new in this checkpoint, but sink {name!r} "
                    f"of the same checkpoint writes the same destination and decided batch "
                    f"{decided[-1]} (this one is about to write batch {batch_id}): a renamed "
                    f"sink would write batches {name!r} decided a second time",
                    sink=self.scope.name, batch_id=batch_id,
                    fix=f"restart the query with the old name {name!r} until Spark has "
                    f"committed batch {decided[-1]} (run at least one batch past it), then "
                    "rename; if both sinks are meant to write the destination, pass "
                    "existing_output='accept' (option sparkeos.existingOutput). Nothing "
                    "was written")

    def pin_on_decision(self, schemas: Mapping[str, pa.Schema]) -> None:
        """Pin the schema and the destination once a batch is decided (never before: a
        batch the sink refused, or one that failed, must not make the corrected query
        look changed)."""
        meta = self.recorded_meta()
        key = "schemas" if self.scope.grouped else "schema"
        if key in meta and meta.get(IDENTITY_PINNED):
            return
        meta.update(self.scope.require_log().read_meta() or {})
        if self.scope.grouped:
            meta.setdefault("schemas", {m: schema_fields(s) for m, s in schemas.items()})
        else:
            meta.setdefault("schema", schema_fields(schemas[SINGLE]))
        identity = (SinkGroup(self.scope.members).identity() if self.scope.grouped
                    else self.scope.members[SINGLE].identity())
        meta["identity"] = meta.get("identity") if meta.get(IDENTITY_PINNED) else identity
        meta[IDENTITY_PINNED] = True
        self.scope.require_log().write_meta(meta)


def held_by_this_process(lease: dict[str, Any] | None) -> bool:
    """A fresh lease this process holds: a sink of the same query run beside this one
    (two sinks of one query may write one destination), never an abandoned name."""
    if not lease_held(lease):
        return False
    assert lease is not None
    return (lease.get("host") == socket.gethostname()
            and int(lease.get("pid") or 0) in (os.getpid(), driver_pid()))


def schema_fields(schema: pa.Schema) -> list[list[str]]:
    """A schema as ``sink.json`` records it: ``[[name, type], ...]``."""
    return [[f.name, str(f.type)] for f in schema]
