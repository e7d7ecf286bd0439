"""Per-process psycopg2 connections, kept out of the (pickled) sink.

Sinks travel to Spark's Python workers by pickling, so they hold only their config;
connections live here, in a small pool per DSN per process. Every connection is in
autocommit mode and the sink issues ``BEGIN`` / ``PREPARE TRANSACTION`` itself, so a
pooled connection is never inside a transaction. Connections inherited through
``fork`` are dropped (never closed: the parent still uses them).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from . import dsn as dsn_mod
from .errors import is_connection_error

T = TypeVar("T")

MAX_IDLE_PER_DSN = 8


class ConnectionPool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[Any]] = {}
        self._inherited: list[Any] = []
        self._pid = os.getpid()

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            self.forget_inherited()

    def forget_inherited(self) -> None:
        # Keep references so their destructors never run (that would close the
        # parent's sockets); the child simply never uses them.
        self._lock = threading.Lock()
        for conns in self._idle.values():
            self._inherited.extend(conns)
        self._idle = {}
        self._pid = os.getpid()

    def connect(self, dsn: str, connect_timeout: int) -> Any:
        import psycopg2

        params = dsn_mod.parse(dsn)
        extra: dict[str, Any] = {}
        if "connect_timeout" not in params:
            extra["connect_timeout"] = connect_timeout
        if "application_name" not in params:
            extra["application_name"] = "sparkeos"
        conn = psycopg2.connect(dsn, **extra)
        try:
            conn.autocommit = True
            conn.set_client_encoding("UTF8")
            with conn.cursor() as cur:
                # Arrow timestamps without a zone are UTC wall-clock values (as in Spark).
                cur.execute("SET TIME ZONE 'UTC'")
        except BaseException:
            conn.close()
            raise
        return conn

    def acquire(self, dsn: str, connect_timeout: int) -> tuple[Any, bool]:
        """A connection and whether it came from the pool (it may have gone stale)."""
        self._check_fork()
        with self._lock:
            idle = self._idle.get(dsn)
            while idle:
                conn = idle.pop()
                if not conn.closed:
                    return conn, True
        return self.connect(dsn, connect_timeout), False

    def release(self, dsn: str, conn: Any) -> None:
        """Return a healthy, idle connection to the pool; close anything else."""
        self._check_fork()
        try:
            import psycopg2.extensions as ext

            healthy = (not conn.closed and conn.info.transaction_status
                       == ext.TRANSACTION_STATUS_IDLE)
        except Exception:
            healthy = False
        if healthy:
            with self._lock:
                idle = self._idle.setdefault(dsn, [])
                if len(idle) < MAX_IDLE_PER_DSN:
                    idle.append(conn)
                    return
        discard(conn)

    def run(self, dsn: str, connect_timeout: int, fn: Callable[[Any], T]) -> T:
        """``fn(conn)`` on a pooled connection; retried once on a fresh connection if a
        pooled one turns out dead (e.g. the server restarted). Only for idempotent work."""
        conn, reused = self.acquire(dsn, connect_timeout)
        try:
            result = fn(conn)
        except Exception as exc:
            if not (reused and is_connection_error(exc)):
                self.release(dsn, conn)  # an SQL error leaves the connection usable
                raise
            discard(conn)
            conn = self.connect(dsn, connect_timeout)
            try:
                result = fn(conn)
            except BaseException:
                self.release(dsn, conn)
                raise
        except BaseException:
            discard(conn)
            raise
        self.release(dsn, conn)
        return result

    def checkout(self, dsn: str, connect_timeout: int, fn: Callable[[Any], None]) -> Any:
        """A connection on which ``fn(conn)`` succeeded, kept by the caller (not pooled)
        until it gives it back with ``release``; a stale pooled one is replaced once."""
        conn, reused = self.acquire(dsn, connect_timeout)
        try:
            fn(conn)
            return conn
        except Exception as exc:
            discard(conn)
            if not (reused and is_connection_error(exc)):
                raise
        except BaseException:
            discard(conn)
            raise
        conn = self.connect(dsn, connect_timeout)
        try:
            fn(conn)
        except BaseException:
            discard(conn)
            raise
        return conn

    def close_dsn(self, dsn: str) -> None:
        with self._lock:
            conns = self._idle.pop(dsn, [])
        for conn in conns:
            discard(conn)

    def close_all(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                discard(conn)


def discard(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass


POOL = ConnectionPool()

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=POOL.forget_inherited)
