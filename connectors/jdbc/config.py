"""The validated configuration of a PostgresSink: its fields, their checks, the DSN as a
secret, and what follows from them (the write path a mode takes, quoted identifiers,
the column names a DataFrame is written to).

The sink is pickled to every executor, so this holds only plain values; connections
live in ``connections.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import ConfigurationError, SchemaMismatchError

from . import arrowpg
from . import dsn as dsn_mod

MODES = ("transactional", "upsert")
DSN_ENV = "SPARKEOS_POSTGRES_DSN"


@dataclass(frozen=True)
class PostgresConfig:
    """What a PostgresSink is given.

    ``dsn``: libpq string, ``postgresql://`` URL, SQLAlchemy URL (``postgresql+psycopg2://``,
    an ``sqlalchemy.engine.URL``) or engine; a secret: never printed or logged.
    ``table``: ``"name"`` or ``"schema.name"``, taken literally (case-sensitive).
    ``key``: key columns of the table; required for ``mode="upsert"``; with
    ``create_table`` it becomes the primary key.
    ``mode``: ``"transactional"`` (two-phase commit of appended rows) or ``"upsert"``
    (``INSERT ... ON CONFLICT (key) DO UPDATE``: exactly-once under ``exactly_once``,
    idempotent under ``at_least_once``); both give every guarantee.
    ``order_by``: for ``mode="upsert"``, the column(s) deciding which row of a key
    repeated within one batch is written (the greatest wins; equal values: any one of
    them). Without it a repeated key refuses the batch (``DataRejectedError``).
    ``commit_in_task``: None (default) chooses by the guarantee: exactly-once prepares
    (appends) or stages (upserts) in the task and commits on the driver; otherwise each
    task commits its own transaction at once, never a prepared one. True always commits
    in the task (at-least-once only).
    ``create_table``: create the table from the DataFrame's schema when it is missing.
    ``columns``: DataFrame column -> table column, for names that differ.
    ``marker_table``: bookkeeping table of committed (query, sink, batch, partition).
    ``lock_timeout_s``: how long a write may wait for a row lock; a wait usually means
    the same key in two partitions of one batch, which otherwise never resolves.
    ``marker_retention``: marker rows of batches older than this many batches are
    deleted (keep it above Spark's ``minBatchesToRetain``, default 100).
    """

    dsn: Any = field(repr=False)
    table: str
    key: Sequence[str] | None = None
    mode: str = "transactional"
    create_table: bool = False
    columns: Mapping[str, str] | None = None
    marker_table: str = "sparkeos_markers"
    lock_timeout_s: float = 30.0
    marker_retention: int = 1000
    connect_timeout_s: int = 10
    order_by: Sequence[str] | None = None
    commit_in_task: bool | None = None

    def __post_init__(self) -> None:
        # Frozen: the normalised values replace what the user gave, once.
        object.__setattr__(self, "dsn", dsn_mod.to_libpq(self.dsn))
        split_name(self.table, "table")
        split_name(self.marker_table, "marker_table")
        if self.mode not in MODES:
            raise ConfigurationError(f"unknown mode {self.mode!r}",
                                     fix=f"use one of: {', '.join(MODES)}")
        key = _checked_key(self.key)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "order_by", _checked_order_by(self.order_by, self.mode, key))
        _check_upsert(self.mode, self.commit_in_task, key)
        if self.columns is not None:
            object.__setattr__(self, "columns", _checked_columns(self.columns))
        _check_limits(self)

    # -- the write path the mode takes ----------------------------------------------------
    @property
    def appends(self) -> bool:
        """Append rows, with the attempt's marker row in the same transaction."""
        return self.mode == "transactional"

    @property
    def prepared_appends(self) -> bool:
        """Append in prepared transactions, committed by gid on the driver."""
        return self.appends and self.commit_in_task is not True

    @property
    def direct_appends(self) -> bool:
        """At-least-once append: each task COMMITs its rows and marker row at once (a
        prepared transaction of a task that dies before its COMMIT PREPARED would hold
        a slot of ``max_prepared_transactions`` and its row locks until a sweep)."""
        return self.appends and self.commit_in_task is True

    @property
    def staged_upserts(self) -> bool:
        """Exactly-once upsert: stage in the task, apply on the driver."""
        return self.mode == "upsert" and self.commit_in_task is not True

    @property
    def plain_upserts(self) -> bool:
        """At-least-once upsert: each task commits its own transaction."""
        return self.mode == "upsert" and self.commit_in_task is True

    # -- derived names ----------------------------------------------------------------------
    @property
    def target(self) -> str:
        """host:port/database, without the password."""
        return dsn_mod.target(self.dsn)

    @property
    def lock_timeout_sql(self) -> str:
        return f"SET LOCAL lock_timeout = '{max(1, int(self.lock_timeout_s * 1000))}ms'"

    def ident(self, name: str) -> Any:
        """``name`` (``table`` or ``schema.table``) as a psycopg2 ``sql.Identifier``."""
        from psycopg2 import sql

        return sql.Identifier(*split_name(name, "table"))

    def target_names(self, schema: pa.Schema) -> tuple[str, ...]:
        """The table columns the DataFrame's columns are written to, in order."""
        mapping = dict(self.columns or {})
        unknown = sorted(set(mapping) - set(schema.names))
        if unknown:
            raise SchemaMismatchError(
                f"columns= maps {', '.join(unknown)}, not in the DataFrame (which has "
                f"{', '.join(schema.names)})",
                fix="map only columns the DataFrame has; nothing was written",
            )
        names = tuple(mapping.get(n, n) for n in schema.names)
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SchemaMismatchError(f"two DataFrame columns go to table column(s) "
                                      f"{', '.join(dupes)}",
                                      fix="rename or drop one of them; nothing was written")
        unsupported = [f"{f.name}: {f.type}" for f in schema if not arrowpg.supported(f.type)]
        if unsupported:
            raise SchemaMismatchError(
                "column types PostgresSink cannot write: " + ", ".join(unsupported),
                fix="cast them (e.g. to string) before the sink; nothing was written",
            )
        return names


def description_args(description: Mapping[str, Any]) -> dict[str, Any]:
    """Constructor arguments from ``describe()``: the DSN is not stored; it comes from
    ``$SPARKEOS_POSTGRES_DSN``, else the stored target without password (libpq then
    uses PGPASSWORD / ~/.pgpass)."""
    args = dict(description)
    stored_target = args.pop("target", None)
    if "dsn" not in args:
        args["dsn"] = os.environ.get(DSN_ENV) or stored_target
    return args


def split_name(name: str, what: str) -> tuple[str, ...]:
    parts = tuple(name.split(".")) if isinstance(name, str) else ()
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise ConfigurationError(
            f"{what}={name!r}: give 'name' or 'schema.name'",
            fix=f"{what}='orders' or {what}='sales.orders' (taken literally, case-sensitive)",
        )
    return parts


def _checked_key(key: Sequence[str] | str | None) -> tuple[str, ...] | None:
    if isinstance(key, str):
        key = (key,)
    if key is None:
        return None
    key = tuple(key)
    if not key or not all(isinstance(k, str) and k for k in key) or len(set(key)) != len(key):
        raise ConfigurationError(f"key={list(key)!r}: give distinct column names",
                                 fix="key=['order_id']")
    return key


def _checked_order_by(order_by: Sequence[str] | str | None, mode: str,
                      key: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if isinstance(order_by, str):
        order_by = (order_by,)
    if order_by is None:
        return None
    order_by = tuple(order_by)
    if mode != "upsert" or not order_by or not all(isinstance(c, str) and c for c in order_by):
        raise ConfigurationError(
            f"order_by={list(order_by)!r} needs mode='upsert' and column names",
            fix="PostgresSink(..., mode='upsert', key=['id'], order_by=['updated_at'])")
    if set(order_by) & set(key or ()):
        raise ConfigurationError(f"order_by={list(order_by)!r} repeats a key column",
                                 fix="order by a column that is not part of the key")
    return order_by


def _check_upsert(mode: str, commit_in_task: Any, key: tuple[str, ...] | None) -> None:
    if commit_in_task not in (None, True, False):
        raise ConfigurationError(f"commit_in_task={commit_in_task!r} must be None, True "
                                 "or False", fix="leave it None: the guarantee chooses")
    if mode == "upsert" and not key:
        raise ConfigurationError(
            "mode='upsert' needs key columns (the ON CONFLICT target)",
            fix="PostgresSink(..., mode='upsert', key=['order_id']); the table needs a "
            "unique index or primary key on exactly those columns",
        )


def _checked_columns(columns: Mapping[str, str]) -> dict[str, str]:
    mapping = dict(columns)
    if not all(isinstance(k, str) and isinstance(v, str) and k and v
               for k, v in mapping.items()):
        raise ConfigurationError("columns must map DataFrame column names to table "
                                 "column names", fix="columns={'id': 'order_id'}")
    return mapping


def _check_limits(config: PostgresConfig) -> None:
    if not config.lock_timeout_s > 0:
        raise ConfigurationError(f"lock_timeout_s={config.lock_timeout_s} must be > 0")
    if config.marker_retention < 10:
        raise ConfigurationError(
            f"marker_retention={config.marker_retention} is too small",
            fix="keep at least as many batches as Spark's minBatchesToRetain (100)",
        )
    if config.connect_timeout_s < 1:
        raise ConfigurationError(f"connect_timeout_s={config.connect_timeout_s} must be >= 1")
