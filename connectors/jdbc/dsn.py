"""Connection strings: libpq DSNs, PostgreSQL URIs and SQLAlchemy URLs / engines.

Everything becomes a libpq connection string that psycopg2 accepts. Passwords never
leave this module in a printable form: :func:`redact` gives the same target without
them (host, port, database, user, non-secret options).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from sparkeos.core.errors import ConfigurationError

_SQLALCHEMY_PG = re.compile(r"^postgres(?:ql)?\+[A-Za-z0-9_]+://", re.IGNORECASE)
_PG_URI = re.compile(r"^postgres(?:ql)?://", re.IGNORECASE)
_OTHER_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SECRET_KEYS = {"password", "sslpassword"}

OTHER_DATABASES = (
    "PostgresSink writes to PostgreSQL only. For another database with two-phase commit, "
    "write a TransactionalSink (a few dozen lines, see connectors/jdbc/sink.py) over "
    "SQLAlchemy's two-phase API: begin() -> conn.begin_twophase(txn.txn_id); write(); "
    "prepare() -> tx.prepare(); commit() -> conn.commit_prepared(gid, recover=True); "
    "rollback() -> conn.rollback_prepared(gid, recover=True); probe() -> "
    "conn.recover_twophase()"
)


def to_libpq(value: Any) -> str:
    """A libpq connection string (key=value or URI) from what the user gave.

    Accepts a libpq DSN (``"host=... dbname=..."``), a URI (``postgresql://...``), an
    SQLAlchemy URL string (``postgresql+psycopg2://...``), an ``sqlalchemy.engine.URL``
    or an SQLAlchemy ``Engine`` (its URL is used; the engine itself is not kept).
    """
    url = getattr(value, "url", None)
    if url is not None and not isinstance(value, str) and hasattr(url, "drivername"):
        value = url  # an Engine
    if hasattr(value, "drivername") and hasattr(value, "render_as_string"):
        backend = str(value.drivername).split("+", 1)[0]
        if backend not in ("postgresql", "postgres"):
            raise ConfigurationError(f"SQLAlchemy URL for {backend!r}", fix=OTHER_DATABASES)
        value = value.set(drivername="postgresql").render_as_string(hide_password=False)
    if not isinstance(value, str) or not value.strip():
        raise ConfigurationError(
            "PostgresSink needs dsn: a libpq connection string, a postgresql:// URL or an "
            "SQLAlchemy URL",
            fix="PostgresSink(dsn='postgresql://user@host:5432/db', table='orders')",
        )
    text = value.strip()
    if _SQLALCHEMY_PG.match(text):
        return _PG_URI.sub("postgresql://", _SQLALCHEMY_PG.sub("postgresql://", text))
    if _PG_URI.match(text):
        return _PG_URI.sub("postgresql://", text)
    other = _OTHER_URL.match(text)
    if other:
        raise ConfigurationError(f"unsupported URL scheme {other.group(1)!r}",
                                 fix=OTHER_DATABASES)
    return text


def parse(dsn: str) -> dict[str, str]:
    """The libpq parameters of ``dsn`` (password included; keep it private)."""
    try:
        from psycopg2.extensions import parse_dsn
    except ImportError:  # pragma: no cover - fallback without psycopg2
        return _parse_fallback(dsn)
    try:
        return {str(k): str(v) for k, v in parse_dsn(dsn).items()}
    except Exception:
        raise ConfigurationError(
            "the PostgreSQL connection string cannot be parsed (not shown: it may hold a "
            "password)",
            fix="use 'postgresql://user@host:port/dbname' or 'host=... port=... dbname=...'",
        ) from None


def _parse_fallback(dsn: str) -> dict[str, str]:
    if _PG_URI.match(dsn):
        parts = urlsplit(dsn)
        out = {"host": parts.hostname or "", "dbname": unquote(parts.path.lstrip("/"))}
        if parts.port:
            out["port"] = str(parts.port)
        if parts.username:
            out["user"] = unquote(parts.username)
        if parts.password:
            out["password"] = unquote(parts.password)
        return {k: v for k, v in out.items() if v}
    return dict(re.findall(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", dsn))


def redact(dsn: str) -> str:
    """``postgresql://user@host:port/dbname?opts`` without any password."""
    params = parse(dsn)
    user = params.get("user", "")
    host = params.get("host", "")
    port = params.get("port", "")
    dbname = params.get("dbname", "")
    netloc = (quote(user, safe="") + "@" if user else "") + quote(host, safe="")
    if port:
        netloc += f":{port}"
    extra = {k: v for k, v in params.items()
             if k not in _SECRET_KEYS | {"user", "host", "port", "dbname"}}
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in sorted(extra.items()))
    return f"postgresql://{netloc}/{quote(dbname, safe='')}" + (f"?{query}" if query else "")


def target(dsn: str) -> str:
    """``host:port/dbname`` for messages (defaults shown as libpq would use them)."""
    params = parse(dsn)
    host = params.get("host") or "localhost"
    return f"{host}:{params.get('port') or '5432'}/{params.get('dbname') or params.get('user', '')}"
