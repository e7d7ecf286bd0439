"""psycopg2 errors translated, in one place, into sparkeos' error hierarchy.

Every sink method runs its database work through :func:`translate_error`, so a
message always says what failed (``doing``), where (host:port/database, never the
password), which sink / batch / transaction, and what to do.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkeos.core.errors import (
    AttemptFencedError,
    ConfigurationError,
    DataRejectedError,
    RetriableError,
    SchemaMismatchError,
    SparkEOSError,
)

PREPARED_LIMIT_FIX = (
    "two-phase commit needs max_prepared_transactions >= 2 x partitions x sinks "
    "writing to this server. As a superuser run "
    "`ALTER SYSTEM SET max_prepared_transactions = 64;` (or set it in postgresql.conf) "
    "and restart PostgreSQL (the setting only changes at a restart); or use "
    "at_least_once(PostgresSink(mode='upsert', key=[...])) (idempotent by key), which "
    "prepares nothing"
)



# SQLSTATE codes (https://www.postgresql.org/docs/current/errcodes-appendix.html).
UNDEFINED_OBJECT = "42704"
LOCK_NOT_AVAILABLE = "55P03"
OBJECT_IN_USE = "55006"
"""E.g. COMMIT PREPARED of a gid another session is committing at this moment."""
OBJECT_NOT_IN_PREREQUISITE_STATE = "55000"
OUT_OF_MEMORY = "53200"
DUPLICATE_OBJECT = "42710"
DUPLICATE_TABLE = "42P07"
UNIQUE_VIOLATION = "23505"
MARKER_KEY_SUFFIX = "_sparkeos_marker_key"
"""The marker table's primary key constraint is named ``<table>_sparkeos_marker_key``."""
INSUFFICIENT_PRIVILEGE = "42501"

_RETRIABLE_CODES = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "53300",  # too_many_connections
    "57014",  # query_canceled (statement_timeout, pg_cancel_backend)
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now (starting up, recovering)
    "58000",  # system_error
    "58030",  # io_error
}
_SCHEMA_CODES = {
    "42P01",  # undefined_table
    "42703",  # undefined_column
    "42804",  # datatype_mismatch
    "42P10",  # invalid_column_reference (ON CONFLICT without a matching unique index)
    "42P16",  # invalid_table_definition
    "428C9",  # generated_always (writing a generated column)
}
_CONFIG_CODES = {
    "28000",  # invalid_authorization_specification
    "28P01",  # invalid_password
    "3D000",  # invalid_catalog_name (no such database)
    "3F000",  # invalid_schema_name
    "42501",  # insufficient_privilege
}


_REFUSALS = (
    (re.compile(r'database "[^"]*" does not exist'),
     "fix the database name in the DSN (dbname=...), or create the database"),
    (re.compile(r'role "[^"]*" does not exist|password authentication failed|'
                r"authentication failed for user|no pg_hba\.conf entry|"
                r"pg_hba\.conf rejects connection"),
     "fix the user or password in the DSN (PGPASSWORD / ~/.pgpass also work), or allow "
     "this host in the server's pg_hba.conf"),
)


def _refused_connection(text: str) -> str | None:
    """The fix for a connection the server refused (no database, bad credentials, a
    pg_hba.conf rejection); psycopg2 gives these no SQLSTATE at connect time."""
    for pattern, fix in _REFUSALS:
        if pattern.search(text):
            return fix
    return None


def pg_code(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg2 error, else None."""
    code = getattr(exc, "pgcode", None)
    return code if isinstance(code, str) else None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


def _detail(exc: BaseException) -> str:
    diag = getattr(exc, "diag", None)
    parts = []
    for attr in ("message_detail", "message_hint"):
        value = getattr(diag, attr, None) if diag is not None else None
        if value:
            parts.append(str(value).strip())
    return f" ({'; '.join(parts)})" if parts else ""


def is_connection_error(exc: BaseException) -> bool:
    """True for a lost or refused connection (psycopg2 OperationalError/InterfaceError
    without a server-side SQLSTATE, or class 08)."""
    try:
        import psycopg2
    except ImportError:  # pragma: no cover - psycopg2 is an install requirement
        return False
    code = pg_code(exc)
    if isinstance(exc, psycopg2.InterfaceError):
        return True
    if isinstance(exc, psycopg2.OperationalError) and (code is None or code.startswith("08")):
        return True
    return code is not None and code.startswith("08")


def prepared_limit_error(
    current: int | str | None,
    *,
    sink: str | None = None,
    batch_id: int | None = None,
    txn_id: str | None = None,
    target: str = "",
    usage: str | None = None,
) -> ConfigurationError:
    where = f" on {target}" if target else ""
    if str(current) == "0":
        problem = (f"prepared transactions are disabled{where} (max_prepared_transactions = "
                   "0), so the exactly-once PostgreSQL sink cannot prepare its transactions")
        fix = PREPARED_LIMIT_FIX
    else:
        shown = f" = {current}" if current is not None else ""
        problem = (f"PostgreSQL has no free prepared-transaction slot{where} "
                   f"(max_prepared_transactions{shown} is used up)")
        if usage:
            problem = f"{problem}: {usage}"
        fix = ("look at SELECT gid, database, prepared FROM pg_prepared_xacts: gids starting "
               "seos-<query key>-<sink>- belong to sparkeos sinks; for a query that no "
               "longer runs, `sparkeos recover <its checkpointLocation>` commits or rolls "
               "them back (never by hand while its commit log may still decide them); "
               "orphans of other tools are ROLLBACK PREPARED '<gid>' by their owner. If the "
               "slots are rightly in use, raise max_prepared_transactions to at least "
               "2 x partitions x sinks writing to this server (a restart of PostgreSQL), or "
               "write fewer partitions per batch; nothing of this batch was committed")
    return ConfigurationError(problem, sink=sink, batch_id=batch_id, txn_id=txn_id, fix=fix)


_AFTER = {
    "write": "nothing of this batch is committed; restarting the query re-runs it",
    "commit": "the batch is decided, so it is committed (not lost) when the query "
              "restarts or `sparkeos recover <checkpointLocation>` runs",
    "setup": "nothing was written",
    "rollback": "the batch was not decided, so none of it becomes visible; the "
                "rollback is repeated when the query restarts",
    "probe": "nothing was changed",
}
"""What follows a failure in each phase, said in every message's fix."""


@dataclass(frozen=True)
class _Failure:
    """A psycopg2 error and the context it is reported in."""

    exc: BaseException
    code: str | None
    doing: str
    message: str
    target: str
    where: str
    after: str
    labels: dict[str, Any]


def translate_error(
    exc: BaseException,
    *,
    doing: str,
    target: str = "",
    sink: str | None = None,
    batch_id: int | None = None,
    txn_id: str | None = None,
    phase: str = "write",
) -> BaseException:
    """Map a psycopg2 error raised while ``doing`` something to a sparkeos error.

    ``phase`` is ``"write"`` (phase 1: the batch is rolled back and nothing is
    committed), ``"commit"`` (phase 2 / recovery: the batch is decided, it will be
    committed on retry), ``"setup"`` (validate: nothing was written), ``"rollback"`` or
    ``"probe"``. Returns ``exc``
    unchanged when it is not a database error (or already a sparkeos error).
    """
    if isinstance(exc, SparkEOSError):
        return exc
    try:
        import psycopg2
    except ImportError:  # pragma: no cover
        return exc
    if not isinstance(exc, psycopg2.Error):
        return exc
    failure = _Failure(
        exc=exc, code=pg_code(exc), doing=doing, message=_first_line(exc) + _detail(exc),
        target=target, where=f" on PostgreSQL at {target}" if target else "",
        after=_AFTER[phase],
        labels={"sink": sink, "batch_id": batch_id, "txn_id": txn_id},
    )
    for rule in _RULES:  # the first rule that recognises the error wins
        translated = rule(failure)
        if translated is not None:
            return translated
    return _unknown(failure)


def _fenced(f: _Failure) -> BaseException | None:
    if f.code == DUPLICATE_OBJECT and "transaction identifier" in f.message:
        return AttemptFencedError(
            f"{f.doing} failed{f.where}: {f.message}: another attempt of this task (a "
            "zombie of a retried stage, which numbers its attempts from 0 again) prepared "
            "under the same transaction ID", **f.labels,
            fix="nothing to do: Spark retries this task under the next attempt number; "
            "the coordinator rolls back the other attempt's transaction if it never commits",
        )
    if f.code == UNIQUE_VIOLATION and _constraint(f.exc).endswith(MARKER_KEY_SUFFIX):
        return AttemptFencedError(
            f"{f.doing} failed{f.where}: another attempt of this task with the same "
            "transaction ID committed first", **f.labels,
            fix="nothing to do: Spark keeps the attempt that committed",
        )
    return None


def _refused(f: _Failure) -> BaseException | None:
    refused = _refused_connection(str(f.exc))
    if refused is None:
        return None
    # The server answered and said no: retrying will not change its answer.
    return ConfigurationError(
        f"{f.doing} failed{f.where}: the server refused the connection: {f.message}",
        **f.labels, fix=f"{refused}; {f.after}")


def _retriable(f: _Failure) -> BaseException | None:
    if not (is_connection_error(f.exc) or f.code in _RETRIABLE_CODES):
        return None
    return RetriableError(
        f"{f.doing} failed{f.where}: {f.message}", **f.labels,
        fix=f"check that the server is up and reachable from every executor; {f.after}",
    )


def _prepared_slots(f: _Failure) -> BaseException | None:
    text = str(f.exc)
    if f.code == OUT_OF_MEMORY and "prepared transaction" in text.lower():
        return prepared_limit_error(None, target=f.target, **f.labels)
    if (f.code == OBJECT_NOT_IN_PREREQUISITE_STATE
            and "prepared transactions are disabled" in text):
        return prepared_limit_error(0, target=f.target, **f.labels)
    return None


def _lock_wait(f: _Failure) -> BaseException | None:
    if f.code != LOCK_NOT_AVAILABLE:
        return None
    return DataRejectedError(
        f"{f.doing} waited too long for a lock{f.where}: {f.message}. Another transaction "
        "holds a row this one needs: usually the same key written by another "
        "partition of this batch (its transaction is prepared and waits for the "
        "batch's decision), another attempt of the same task (one that died after "
        "preparing: the batch is rolled back and re-run), or another writer on the "
        "table", **f.labels,
        fix="make keys unique within a batch (e.g. dropDuplicates on the key, or "
        f"repartition by the key), or use mode='upsert'; {f.after}",
    )


def _by_class(f: _Failure) -> BaseException | None:
    """Schema, configuration and data errors, told apart by their SQLSTATE."""
    if f.code in _SCHEMA_CODES:
        return SchemaMismatchError(
            f"{f.doing} failed{f.where}: the table does not fit the data: {f.message}",
            **f.labels,
            fix="align the table with the DataFrame (or pass columns= / create_table=True); "
            f"{f.after}",
        )
    if f.code in _CONFIG_CODES:
        return ConfigurationError(
            f"{f.doing} failed{f.where}: {f.message}", **f.labels,
            fix="check the DSN's user, database and the role's privileges (the sink needs "
            "INSERT on the table, CREATE on its schema for the marker table, and "
            f"SELECT on pg_prepared_xacts); {f.after}",
        )
    if f.code is not None and f.code[:2] in ("22", "23"):
        return DataRejectedError(
            f"PostgreSQL rejected a row{f.where} while {f.doing}: {f.message}", **f.labels,
            fix=f"fix the data or the table's constraint; the whole batch failed and "
            f"{f.after}",
        )
    return None


def _unknown(f: _Failure) -> BaseException:
    return SparkEOSError(
        f"{f.doing} failed{f.where}: {f.message}" + (f" [SQLSTATE {f.code}]" if f.code else ""),
        **f.labels, fix=f.after,
    )


_RULES: tuple[Callable[[_Failure], BaseException | None], ...] = (
    _fenced, _refused, _retriable, _prepared_slots, _lock_wait, _by_class,
)
"""In order: a fenced attempt before a refusal, a refusal before a retriable error."""


def _constraint(exc: BaseException) -> str:
    diag = getattr(exc, "diag", None)
    return str(getattr(diag, "constraint_name", "") or "")
