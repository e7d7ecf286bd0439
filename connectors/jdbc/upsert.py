"""Exactly-once upserts: stage in phase 1, apply by key in phase 2 with the marker row.

An upsert inside a prepared transaction would hold its row locks from phase 1 to
phase 2: a retried task (an attempt after one that prepared and then died) would wait
on its own batch's locks until the lock timeout, and the batch would fail. So:

    phase 1 (task)    BEGIN; CREATE TABLE <stage of the attempt> AS ... WITH NO DATA;
                      COPY into it; refuse keys repeated without order_by; COMMIT.
                      Durable and invisible: nothing but this attempt knows the table.
    phase 2 (driver)  one local transaction: the marker row (claims the partition:
                      a second commit of the same ID waits on it, then finds it),
                      INSERT INTO target SELECT DISTINCT ON (key) ... FROM stage
                      ON CONFLICT (key) DO UPDATE, DROP the stage; COMMIT. Then
                      partition 0 deletes marker rows past the retention, in a
                      statement of its own.
    rollback          DROP the attempt's stage (and end its session).

Stage tables live in the marker table's schema, named after a hash of the attempt's
transaction ID, so a sweep computes the names of every attempt it covers. No
prepared transactions: this works where ``max_prepared_transactions`` is 0.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from sparkeos.core.errors import AttemptFencedError, DataRejectedError
from sparkeos.core.snapshot.fingerprint import Written
from sparkeos.core.snapshot.txpool import Transaction
from sparkeos.core.steps import commit_step

from . import markers
from .errors import DUPLICATE_TABLE, UNIQUE_VIOLATION, pg_code

STAGE_PREFIX = "sparkeos_upsert_"


def stage_name(txn_id: str) -> str:
    """The stage table's name: fits PostgreSQL's 63 bytes, one per attempt."""
    return STAGE_PREFIX + hashlib.sha256(txn_id.encode()).hexdigest()[:32]


def stage_ident(marker: Any, txn_id: str) -> Any:
    from psycopg2 import sql

    return sql.Identifier(*marker.strings[:-1], stage_name(txn_id))


def create_stage(cur: Any, stage: Any, target: Any, columns: Sequence[str]) -> None:
    from psycopg2 import sql

    cur.execute(sql.SQL("CREATE TABLE {s} AS SELECT {c} FROM {t} WITH NO DATA").format(
        s=stage, t=target, c=sql.SQL(", ").join(sql.Identifier(c) for c in columns)))


def create_attempt_stage(cur: Any, stage: Any, target: Any, columns: Sequence[str],
                         txn: Transaction) -> None:
    """The attempt's stage table; one that exists already belongs to a zombie with the
    same ID, which fences this attempt off."""
    try:
        create_stage(cur, stage, target, columns)
    except Exception as exc:
        if pg_code(exc) != DUPLICATE_TABLE:
            raise
        raise AttemptFencedError(
            f"the stage table of {txn.txn_id} exists already: another attempt with "
            "the same ID (a zombie of a retried stage) holds it; this one writes "
            "nothing", sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="none needed: Spark retries the task under the next attempt number",
        ) from exc


def refuse_repeated_keys(cur: Any, stage: Any, txn: Transaction, key: Sequence[str],
                         table: str) -> None:
    """Without ``order_by`` nothing says which row of a repeated key is the latest
    (arrival order is not stable across task attempts): refuse the batch."""
    found = repeated_key(cur, stage, key)
    if found is None:
        return
    values, times = found
    shown = ", ".join(f"{k}={v!r}" for k, v in zip(key, values, strict=True))
    raise DataRejectedError(
        f"key ({shown}) appears {times} times in batch {txn.batch_id}: mode='upsert' "
        f"writes one row per key of {table}, and nothing says which of them is the "
        "latest; every transaction of the batch is rolled back",
        sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
        fix="pass order_by=['<column>'] (the row with the greatest value is written, "
        "e.g. an event time or version), or deduplicate the batch by key before the "
        "sink (e.g. an aggregation), then restart the query",
    )


def repeated_key(cur: Any, stage: Any, key: Sequence[str]) -> tuple[tuple[Any, ...], int] | None:
    """One key that appears more than once in ``stage``, and how often."""
    from psycopg2 import sql

    keys = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    cur.execute(sql.SQL("SELECT {k}, count(*) FROM {s} GROUP BY {k} HAVING count(*) > 1"
                        " LIMIT 1").format(k=keys, s=stage))
    row = cur.fetchone()
    return None if row is None else (tuple(row[:-1]), int(row[-1]))


def upsert_sql(target: Any, source: Any, columns: Sequence[str], key: Sequence[str],
               order_by: Sequence[str]) -> Any:
    """``INSERT ... SELECT DISTINCT ON (key) ... ON CONFLICT (key) DO UPDATE``: one row per
    key (ON CONFLICT cannot touch a row twice in one statement), the greatest
    ``order_by``."""
    from psycopg2 import sql

    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    others = [c for c in columns if c not in key]
    if others:
        action = sql.SQL("DO UPDATE SET ") + sql.SQL(", ").join(
            sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in others)
    else:
        action = sql.SQL("DO NOTHING")
    order = [sql.SQL("{} DESC NULLS LAST").format(sql.Identifier(c))
             for c in order_by]
    return sql.SQL(
        "INSERT INTO {t} ({c}) SELECT DISTINCT ON ({k}) {c} FROM {s} ORDER BY {o}"
        " ON CONFLICT ({k}) {a}"
    ).format(t=target, c=cols, k=keys, s=source, o=sql.SQL(", ").join([keys, *order]),
             a=action)


def publish(conn: Any, txn: Transaction, marker: Any, target: Any, columns: Sequence[str],
            key: Sequence[str], order_by: Sequence[str], lock_timeout_sql: str,
            written: Written | None = None) -> str:
    """Apply the attempt's stage to ``target`` once. Returns ``"published"``,
    ``"already"`` (committed before by this ID), ``"other:<txn id>"`` (another ID
    committed the partition) or ``"missing"`` (no stage and no marker: lost).

    The marker row is inserted before the stage is looked at: a twin commit of the same
    ID (the driver and ``recover --force``) then either waits on that row's key until
    this one ends and finds it committed, or this one waits on the twin's. So a stage
    found missing after the insert was never applied by anyone: it is lost, not
    committed by a twin that dropped it a moment ago."""
    from psycopg2 import sql

    stage = stage_ident(marker, txn.txn_id)
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        try:
            cur.execute(lock_timeout_sql)
            held = markers.committed_txn(conn, marker, txn)
            if held is None:
                try:
                    markers.insert(cur, marker, txn, written)
                except Exception as exc:
                    if pg_code(exc) != UNIQUE_VIOLATION:
                        raise
                    # Another commit of this ID got there first and has committed.
                    cur.execute("ROLLBACK")
                    return "already"
                commit_step("claimed", txn)
                cur.execute("SELECT to_regclass(%s)", (stage.as_string(conn),))
                if cur.fetchone()[0] is None:
                    cur.execute("ROLLBACK")
                    return "missing"
                cur.execute(upsert_sql(target, stage, columns, key, order_by))
                cur.execute(sql.SQL("DROP TABLE {s}").format(s=stage))
                cur.execute("COMMIT")
                commit_step("applied", txn)
                return "published"
            cur.execute("ROLLBACK")
        except BaseException:
            with contextlib.suppress(Exception):  # the cause matters, not this
                cur.execute("ROLLBACK")
            raise
    if held == txn.txn_id:
        drop_stages(conn, marker, [txn.txn_id])  # a leftover of an interrupted commit
        return "already"
    return f"other:{held}"


def existing_stages(conn: Any, marker: Any, txn_ids: Iterable[str]) -> list[str]:
    """The transaction IDs among ``txn_ids`` whose stage table exists."""
    by_name = {stage_name(t): t for t in txn_ids}
    if not by_name:
        return []
    schema = marker.strings[:-1]
    with conn.cursor() as cur:
        if schema:
            cur.execute("SELECT c.relname::text FROM pg_class c JOIN pg_namespace n"
                        " ON n.oid = c.relnamespace WHERE n.nspname = %s"
                        " AND c.relname = ANY(%s)", (schema[0], list(by_name)))
        else:
            cur.execute("SELECT relname::text FROM pg_class WHERE relname = ANY(%s)"
                        " AND pg_table_is_visible(oid)", (list(by_name),))
        return [by_name[r[0]] for r in cur.fetchall()]


def drop_stages(conn: Any, marker: Any, txn_ids: Sequence[str]) -> None:
    from psycopg2 import sql

    if not txn_ids:
        return
    with conn.cursor() as cur:
        cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
            sql.SQL(", ").join(stage_ident(marker, t) for t in txn_ids)))
