"""A fault-injecting HTTP proxy: what a bad network day does to a store's replies.

Put it between sparkeos and an HTTP store (an S3-compatible server) and tell it which
requests to hurt and how:

    with FaultProxy("http://127.0.0.1:29900") as proxy:      # proxy.endpoint: its URL
        proxy.add(Fault(LOST_REPLY, method="PUT", path=r"/record$", conditional=True))
        files = S3Files("s3a", bucket, proxy.endpoint)
        files.create_new("/ckpt/record", b"x")               # applied, its reply lost
        assert proxy.injected                                 # the fault happened

Faults (``Fault.action``):

* ``LOST_REPLY``: the request is forwarded and applied; the proxy reads the store's
  answer and closes the client's connection without it (a reply lost on the way back:
  the client's retry meets its own write);
* ``RESET``: the connection is closed before the request reaches the store (nothing
  applied);
* ``SLOW_DOWN``: answered ``503 SlowDown`` without reaching the store (S3's throttle);
* ``SERVER_ERROR``: answered ``500 InternalError`` without reaching the store;
* ``STRIP_CONDITIONS``: forwarded without its preconditions (``If-None-Match``,
  ``If-Match``, GCS's ``ifGenerationMatch``): the store as one that ignores them, which
  sparkeos must refuse;
* ``DELAY``: forwarded after ``delay_s`` seconds (a slow store; a client's read
  timeout below it makes it a lost reply the client times out on).

A fault matches by method, a regular expression searched in the request's path (query
included), and ``conditional`` (the request carries ``If-None-Match`` / ``If-Match``, or
GCS's ``ifGenerationMatch``);
it fires ``times`` times (None: every match), or on a seeded ``fraction`` of matches.
Everything else is forwarded untouched. Each injected fault is recorded in
``proxy.injected`` (action, method, path) for the test's assertion that it happened,
and every request in ``proxy.requests`` (method, path).
"""

from __future__ import annotations

import http.client
import random
import re
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Generic, Self, TypeVar

LOST_REPLY = "lost_reply"
RESET = "reset"
SLOW_DOWN = "slow_down"
SERVER_ERROR = "server_error"
STRIP_CONDITIONS = "strip_conditions"
DELAY = "delay"
ACTIONS = (LOST_REPLY, RESET, SLOW_DOWN, SERVER_ERROR, STRIP_CONDITIONS, DELAY)
_CONDITION_HEADERS = frozenset({"if-none-match", "if-match"})
_CONDITION_QUERY = re.compile(r"([?&])ifGenerationMatch=[^&]*&?")
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer",
                         "upgrade", "proxy-connection"})
_ERRORS = {
    SLOW_DOWN: (503, "SlowDown", "Please reduce your request rate."),
    SERVER_ERROR: (500, "InternalError", "We encountered an internal error."),
}


@dataclass(kw_only=True)
class Firing:
    """When a matching fault hurts its request: on its first ``times`` matches (None:
    every one), or on a seeded ``fraction`` of them (the same run each time). Shared by
    this proxy's ``Fault`` and ``tcpproxy.WireFault``."""

    times: int | None = 1
    fraction: float | None = None
    seed: int = 37
    delay_s: float = 1.0
    """How long a ``DELAY`` holds the request before forwarding it."""
    fired: int = field(default=0, init=False)
    _random: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        if self.fraction is not None:
            self.times = None

    def hurts(self) -> bool:
        """Whether this match is hurt (and count it)."""
        if self.fraction is not None:
            hurt = self._random.random() < self.fraction
        elif self.times is None:
            hurt = True
        else:
            hurt = self.times > 0
            self.times -= hurt
        self.fired += hurt
        return hurt


@dataclass
class Fault(Firing):
    action: str
    method: str | None = None
    path: str = ""
    """A regular expression searched in the request's path and query."""
    conditional: bool | None = None
    """True: only requests with ``If-None-Match`` / ``If-Match``; False: only without."""

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown fault {self.action!r}; one of {ACTIONS}")
        super().__post_init__()

    def matches(self, method: str, path: str, headers: Any) -> bool:
        if self.method is not None and method != self.method:
            return False
        if self.path and not re.search(self.path, urllib.parse.unquote(path)):
            return False
        if self.conditional is not None:
            conditional = is_conditional(path, headers)
            if conditional != self.conditional:
                return False
        return True


def is_conditional(path: str, headers: Any) -> bool:
    return bool(headers.get("If-None-Match") or headers.get("If-Match")
                or "ifGenerationMatch=" in path)


FaultT = TypeVar("FaultT", bound=Firing)


class FaultRules(Generic[FaultT]):
    """A proxy's faults, tried in order on each request, and its serving thread."""

    def __init__(self, thread_name: str) -> None:
        self.faults: list[FaultT] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name=thread_name, daemon=True)

    def add(self, fault: FaultT) -> FaultT:
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class FaultProxy(FaultRules[Fault]):
    """The proxy, on a free port of 127.0.0.1, in a thread of this process."""

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlparse(upstream)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"FaultProxy forwards to http://host:port, not {upstream!r}")
        super().__init__("sparkeos-fault-proxy")
        self.upstream = (parsed.hostname, parsed.port or 80)
        self.injected: list[tuple[str, str, str]] = []
        self.requests: list[tuple[str, str]] = []
        """Every request seen (method, path with query), in order."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _serve(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def choose(self, method: str, path: str, headers: Any) -> Fault | None:
        """The fault for this request, if one fires (recorded)."""
        with self._lock:
            self.requests.append((method, path))
            for fault in self.faults:
                if fault.matches(method, path, headers) and fault.hurts():
                    self.injected.append((fault.action, method, path))
                    return fault
        return None


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test's output is the store's client's

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                raw = bytearray()
                while True:
                    line = self.rfile.readline()
                    raw += line
                    size = int(line.split(b";")[0].strip() or b"0", 16)
                    chunk = self.rfile.read(size + 2)
                    raw += chunk
                    if size == 0:
                        while chunk not in (b"\r\n", b""):  # trailers, then the end
                            chunk = self.rfile.readline()
                            raw += chunk
                        return bytes(raw)
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _handle(self) -> None:
            body = self._body()
            fault = proxy.choose(self.command, self.path, self.headers)
            action = fault.action if fault is not None else None
            if fault is not None and action == DELAY:
                time.sleep(fault.delay_s)
            if action == RESET:
                self._drop()
                return
            if action in _ERRORS:
                status, code, message = _ERRORS[action]
                self._answer(status, [("Content-Type", "application/xml")], (
                    f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                    f"<Message>{message}</Message></Error>").encode())
                return
            status, headers, answer = self._forward(body, action == STRIP_CONDITIONS)
            if action == LOST_REPLY:
                self._drop()
                return
            self._answer(status, headers, answer)

        def _forward(self, body: bytes, unconditional: bool = False
                     ) -> tuple[int, list[tuple[str, str]], bytes]:
            connection = http.client.HTTPConnection(*proxy.upstream, timeout=120)
            path = self.path
            if unconditional:
                path = _CONDITION_QUERY.sub(r"\1", path).rstrip("?&")
            try:
                connection.putrequest(self.command, path, skip_host=True,
                                      skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if unconditional and name.lower() in _CONDITION_HEADERS:
                        continue
                    if name.lower() not in _HOP_BY_HOP or name.lower() == "transfer-encoding":
                        connection.putheader(name, value)
                connection.endheaders(body or None)
                response = connection.getresponse()
                answer = response.read()
                # A HEAD's length is the object's; any other answer's is of ``answer``.
                headers = [(k, v) for k, v in response.getheaders()
                           if k.lower() not in _HOP_BY_HOP and (
                               k.lower() != "content-length" or self.command == "HEAD")]
                return response.status, headers, answer
            finally:
                connection.close()

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response_only(status)
            for name, value in headers:
                self.send_header(name, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            self.wfile.flush()

        def _drop(self) -> None:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        do_GET = do_PUT = do_POST = do_PATCH = do_DELETE = do_HEAD = _handle

    return Handler


__all__ = ["ACTIONS", "DELAY", "LOST_REPLY", "RESET", "SERVER_ERROR", "SLOW_DOWN",
           "STRIP_CONDITIONS", "Fault", "FaultProxy", "is_conditional"]
