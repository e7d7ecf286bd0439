"""The checks before a batch may be decided, and what the decision pins.

Before any task writes: the sinks judge the batch's schema, the schema must be the one
the sink has committed, and a sink whose log is new must not hold another query's
committed output under its name. Once a batch is decided, the schema and the
destination (``identity()``) are pinned in ``sink.json``; never before, so a batch that
was refused or failed cannot make the corrected query look changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from .commitlog import IDENTITY_PINNED
from .errors import ConfigurationError, SchemaMismatchError
from .group import SINGLE, SinkGroup
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


def schema_fields(schema: pa.Schema) -> list[list[str]]:
    """A schema as ``sink.json`` records it: ``[[name, type], ...]``."""
    return [[f.name, str(f.type)] for f in schema]
