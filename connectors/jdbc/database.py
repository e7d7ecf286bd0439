"""How the sink reaches PostgreSQL: one pooled connection per call, and the one place
database errors become sparkeos errors (naming who holds the prepared-transaction slots
when they are used up).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from sparkeos.core.snapshot.txpool import Transaction, TransactionPool

from . import prepared
from .config import PostgresConfig
from .connections import POOL
from .errors import OUT_OF_MEMORY, pg_code, prepared_limit_error, translate_error

T = TypeVar("T")


def run(config: PostgresConfig, doing: str, work: Callable[[Any], T],
        txn: Transaction | None = None, phase: str = "write") -> T:
    """``work(conn)`` on a pooled connection, its errors translated."""
    with translated(config, doing, txn, phase):
        return POOL.run(config.dsn, config.connect_timeout_s, work)


@contextlib.contextmanager
def translated(config: PostgresConfig, doing: str, txn: Transaction | None = None,
               phase: str = "write") -> Iterator[None]:
    """Database errors raised inside become sparkeos errors (see ``errors.py``)."""
    try:
        yield
    except Exception as exc:
        out = translate_error(
            exc, doing=doing, target=config.target, phase=phase,
            sink=txn.sink if txn else None, batch_id=txn.batch_id if txn else None,
            txn_id=txn.txn_id if txn else None,
        )
        if out is exc:
            raise
        if pg_code(exc) == OUT_OF_MEMORY and txn is not None:
            out = _pool_full_error(config, txn, out)
        raise out from exc


def _pool_full_error(config: PostgresConfig, txn: Transaction, error: Any) -> Any:
    """Say who holds the prepared-transaction slots, and how to free orphans."""
    prefix = TransactionPool(txn.query_key, txn.sink).prefix
    try:
        usage = POOL.run(config.dsn, config.connect_timeout_s,
                         lambda conn: prepared.usage(conn, prefix))
    except Exception:
        return error  # the plain advice is still right
    return prepared_limit_error(
        usage.limit, sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
        target=config.target, usage=usage.describe(prefix))


def execute(conn: Any, statement: str, params: tuple[Any, ...] | None = None) -> None:
    with conn.cursor() as cur:
        cur.execute(statement, params)


def execute_all(conn: Any, *statements: str) -> None:
    with conn.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
