"""A small synchronous layer over stomp.py: one connection, frames confirmed by RECEIPT.

stomp.py delivers frames on its own receiver thread through listener callbacks. The
connectors need the opposite: "send this and return once the broker confirmed it, or
raise". :class:`StompClient` gives that, plus a queue of received MESSAGE frames.

Brokers differ in ways that decide the design (``docs/connectors/stomp.md``): only
ActiveMQ Artemis detects duplicates (``_AMQ_DUPL_ID``); a STOMP transaction never
survives its connection; Artemis applies ACKs at once even inside a transaction.
:func:`broker_kind` tells them apart from the CONNECTED frame's ``server`` header.
"""

from __future__ import annotations

import itertools
import queue
import socket
import ssl as ssl_module
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkeos.core.errors import ConfigurationError, RetriableError, SparkEOSError

ARTEMIS = "artemis"
CLASSIC = "activemq"
RABBITMQ = "rabbitmq"
OTHER = "other"


class BrokerRejected(Exception):
    """The broker answered a frame with ERROR (its message and headers kept)."""

    def __init__(self, message: str, headers: Mapping[str, str] | None = None,
                 body: str = "") -> None:
        super().__init__(message)
        self.headers = dict(headers or {})
        self.body = body


class ConnectionLost(Exception):
    """The connection dropped before the broker confirmed a frame."""


@dataclass(frozen=True)
class Endpoint:
    """Where a broker listens and how to log in: parsed from a ``stomp://`` URL.

    ``stomp://[login[:passcode]@]host:port[?vhost=/&ssl=true]``; ``stomp+ssl://`` turns
    TLS on. The passcode is kept out of ``repr`` and of :meth:`redacted`.
    """

    host: str
    port: int
    login: str | None = None
    passcode: str | None = field(default=None, repr=False)
    vhost: str | None = None
    ssl: bool = False

    @classmethod
    def parse(cls, url: str, *, passcode: str | None = None) -> Endpoint:
        if not isinstance(url, str) or "://" not in url:
            raise ConfigurationError(
                f"not a STOMP URL: {redact_url(str(url))!r}",
                fix="use stomp://[login:passcode@]host:port (stomp+ssl:// for TLS), e.g. "
                "stomp://admin:admin@broker:61613",
            )
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("stomp", "stomp+ssl", "stomp+tls"):
            raise ConfigurationError(
                f"unsupported scheme {parts.scheme!r} in {redact_url(url)!r}",
                fix="use stomp:// or stomp+ssl://",
            )
        try:
            port = parts.port or 61613
        except ValueError:
            raise ConfigurationError(f"bad port in {redact_url(url)!r}",
                                     fix="use stomp://host:61613") from None
        if not parts.hostname:
            raise ConfigurationError(f"no host in {redact_url(url)!r}",
                                     fix="use stomp://host:61613")
        query = dict(urllib.parse.parse_qsl(parts.query))
        unknown = sorted(set(query) - {"vhost", "ssl"})
        if unknown:
            raise ConfigurationError(
                f"unknown URL parameter(s) {', '.join(unknown)} in {redact_url(url)!r}",
                fix="the URL takes vhost= and ssl=true; pass other settings as arguments",
            )
        secret = urllib.parse.unquote(parts.password) if parts.password else None
        return cls(
            host=parts.hostname, port=port,
            login=urllib.parse.unquote(parts.username) if parts.username else None,
            passcode=passcode if passcode is not None else secret,
            vhost=query.get("vhost"),
            ssl=parts.scheme != "stomp" or query.get("ssl", "").lower() in ("1", "true"),
        )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (what logs and errors show)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    netloc = f"{user}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def broker_kind(server: str | None) -> str:
    """artemis | activemq (Classic) | rabbitmq | other, from CONNECTED's ``server``."""
    text = (server or "").lower()
    if "artemis" in text:
        return ARTEMIS
    if text.startswith("activemq"):
        return CLASSIC
    if "rabbitmq" in text:
        return RABBITMQ
    return OTHER


class _Listener:
    """stomp.py callbacks -> queues and events the client waits on."""

    def __init__(self) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        self.lock = threading.Condition()
        self.receipts: set[str] = set()
        self.errors: list[BrokerRejected] = []
        self.disconnected = False
        self.server: str | None = None

    def on_connected(self, frame: Any) -> None:
        self.server = frame.headers.get("server")

    def on_message(self, frame: Any) -> None:
        self.messages.put(frame)

    def on_receipt(self, frame: Any) -> None:
        with self.lock:
            self.receipts.add(frame.headers.get("receipt-id", ""))
            self.lock.notify_all()

    def on_error(self, frame: Any) -> None:
        body = frame.body.decode("utf-8", "replace") if isinstance(
            frame.body, (bytes, bytearray)) else str(frame.body or "")
        error = BrokerRejected(frame.headers.get("message", "ERROR frame"), frame.headers,
                               body)
        with self.lock:
            self.errors.append(error)
            self.lock.notify_all()

    def on_disconnected(self) -> None:
        with self.lock:
            self.disconnected = True
            self.lock.notify_all()


_receipt_ids = itertools.count(1)


class StompClient:
    """One STOMP 1.2 connection. Not thread-safe; one per task or reader."""

    def __init__(self, endpoint: Endpoint, *, timeout_s: float = 30.0,
                 heartbeats: tuple[int, int] = (0, 0),
                 ssl_options: Mapping[str, Any] | None = None,
                 connect_headers: Mapping[str, str] | None = None) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.heartbeats = heartbeats
        self.ssl_options = dict(ssl_options or {})
        self.connect_headers = dict(connect_headers or {})
        self._conn: Any = None
        self._listener = _Listener()

    # -- connection ----------------------------------------------------------------------
    def connect(self) -> StompClient:
        import stomp

        host = (self.endpoint.host, self.endpoint.port)
        conn = stomp.Connection12([host], heartbeats=self.heartbeats, auto_decode=False,
                                  vhost=self.endpoint.vhost, timeout=self.timeout_s,
                                  reconnect_attempts_max=1)
        if self.endpoint.ssl:
            conn.set_ssl(for_hosts=[host], **self.ssl_options)
        conn.set_listener("sparkeos", self._listener)
        try:
            conn.connect(self.endpoint.login, self.endpoint.passcode, wait=True,
                         headers=self.connect_headers)
        except Exception as exc:
            self._safe_disconnect(conn)
            raise self._connect_error(exc) from None
        if self._listener.errors or not conn.is_connected():
            self._safe_disconnect(conn)
            raise self._connect_error(None)
        self._conn = conn
        return self

    def _connect_error(self, exc: BaseException | None) -> SparkEOSError:
        where = self.endpoint.address
        errors = self._listener.errors
        if errors:
            text = f"{errors[0]} {errors[0].body}".strip()
            lowered = text.lower()
            if any(w in lowered for w in ("security", "auth", "login", "password",
                                          "access_refused", "credentials", "not allowed")):
                return ConfigurationError(
                    f"the STOMP broker at {where} refused the login of "
                    f"{self.endpoint.login!r}: {text[:300]}",
                    fix="check the login and passcode in the URL (stomp://login:passcode@"
                    "host:port) and the user's permissions on the broker",
                )
            return RetriableError(f"the STOMP broker at {where} refused the connection: "
                                  f"{text[:300]}",
                                  fix="check the broker's log; nothing was written")
        if isinstance(exc, (ssl_module.SSLError,)):
            return ConfigurationError(f"TLS handshake with the STOMP broker at {where} "
                                      f"failed: {exc}", fix="check the ssl settings")
        reason = f" ({type(exc).__name__}: {exc})" if exc is not None and str(exc) else ""
        if not reachable(self.endpoint, min(self.timeout_s, 5.0)):
            return RetriableError(
                f"nothing answers at {where} (connection refused or unreachable)",
                fix="start the STOMP broker or fix the host and port in the URL; nothing "
                "of this batch was written",
            )
        return RetriableError(
            f"the STOMP broker at {where} did not answer within {self.timeout_s:g} s{reason}",
            fix="start the broker or fix the host and port in the URL; nothing of this "
            "batch was written",
        )

    @property
    def server(self) -> str | None:
        return self._listener.server

    @property
    def kind(self) -> str:
        return broker_kind(self.server)

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._listener.disconnected

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._safe_disconnect(conn)

    @staticmethod
    def _safe_disconnect(conn: Any) -> None:
        try:
            conn.disconnect()
        except Exception:
            pass
        try:
            conn.transport.stop()
        except Exception:
            pass

    def __enter__(self) -> StompClient:
        return self.connect() if self._conn is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- frames ----------------------------------------------------------------------------
    def _require(self) -> Any:
        if self._conn is None:
            raise ConnectionLost("not connected")
        self._raise_pending()
        return self._conn

    def _raise_pending(self) -> None:
        with self._listener.lock:
            if self._listener.errors:
                raise self._listener.errors.pop(0)
            if self._listener.disconnected:
                raise ConnectionLost(f"the connection to {self.endpoint.address} dropped")

    def new_receipt(self) -> str:
        return f"seos-r{next(_receipt_ids)}"

    def wait_receipt(self, receipt: str, what: str) -> None:
        """Until the broker confirmed ``receipt``; an ERROR frame or a dropped
        connection raises (the frame's effect is then unknown: callers treat it so)."""
        deadline = time.monotonic() + self.timeout_s
        listener = self._listener
        with listener.lock:
            while receipt not in listener.receipts:
                if listener.errors:
                    raise listener.errors.pop(0)
                if listener.disconnected:
                    raise ConnectionLost(
                        f"the connection to {self.endpoint.address} dropped before the broker "
                        f"confirmed {what}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the broker at {self.endpoint.address} did not confirm "
                                       f"{what} within {self.timeout_s:g} s")
                listener.lock.wait(min(remaining, 1.0))
            listener.receipts.discard(receipt)

    def send(self, destination: str, body: bytes, headers: Mapping[str, str],
             transaction: str | None = None, receipt: str | None = None) -> None:
        conn = self._require()
        extra = dict(headers)
        if transaction is not None:
            extra["transaction"] = transaction
        if receipt is not None:
            extra["receipt"] = receipt
        conn.send(destination, body, headers=extra)

    def send_all(self, frames: Iterable[tuple[str, bytes, Mapping[str, str]]],
                 what: str) -> int:
        """Send every (destination, body, headers); return once the broker confirmed
        them all: it processes a connection's frames in order and answers a persistent
        send's receipt once the message is stored, so the last send carries the one
        receipt. Returns how many were sent."""
        pending: tuple[str, bytes, Mapping[str, str]] | None = None
        count = 0
        for frame in frames:
            if pending is not None:
                self.send(*pending)
            pending = frame
            count += 1
        if pending is not None:
            receipt = self.new_receipt()
            self.send(*pending, receipt=receipt)
            self.wait_receipt(receipt, f"{count} messages ({what})")
        return count

    def subscribe(self, destination: str, subscription: str, ack: str,
                  headers: Mapping[str, str] | None = None) -> None:
        receipt = self.new_receipt()
        self._require().subscribe(destination, subscription, ack=ack,
                                  headers={**(headers or {}), "receipt": receipt})
        self.wait_receipt(receipt, f"SUBSCRIBE to {destination}")

    def receive(self, timeout_s: float) -> Any:
        """The next MESSAGE frame, or None after ``timeout_s`` without one."""
        try:
            return self._listener.messages.get(timeout=timeout_s)
        except queue.Empty:
            self._raise_pending()
            return None

    def ack(self, ack_id: str, receipt: str | None = None) -> None:
        self._require().ack(ack_id, receipt=receipt)


def reachable(endpoint: Endpoint, timeout_s: float) -> bool:
    """A TCP connection to the broker's port opens (cheap check before a full login)."""
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s):
            return True
    except OSError:
        return False


__all__ = [
    "ARTEMIS",
    "CLASSIC",
    "OTHER",
    "RABBITMQ",
    "BrokerRejected",
    "ConnectionLost",
    "Endpoint",
    "StompClient",
    "broker_kind",
    "reachable",
    "redact_url",
]
