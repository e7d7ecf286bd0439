"""A fault-injecting TCP proxy: what a bad network day does to a database's or a
broker's replies.

Put it between sparkeos and PostgreSQL, Kafka or a STOMP broker, name the protocol and
tell it which request to hurt:

    with TcpFaultProxy("127.0.0.1:25432", POSTGRES) as proxy:    # proxy.address
        proxy.add(WireFault(LOST_REPLY, r"^COMMIT PREPARED"))
        conn = psycopg2.connect(host=proxy.host, port=proxy.port, ...)
        ...                                    # the COMMIT is applied, its reply lost
        assert proxy.injected                  # the fault happened

The proxy reads the frames of each direction (``wireprotocols``) so that a fault
matches one request by a regular expression searched in its summary:

* PostgreSQL: the SQL of a simple Query or a Parse (``COMMIT PREPARED 'seos-...'``);
* Kafka: ``<ApiName> v<version>``, EndTxn with ``commit``/``abort`` and the
  transactional id (``EndTxn v4 commit seos-...``);
* STOMP: the command and its headers (``SEND destination:q ... receipt:seos-r7``).

Faults (``WireFault.action``; the names of ``wireproxy``, the HTTP proxy):

* ``LOST_REPLY``: the request is forwarded and applied; the proxy swallows the server's
  reply to it and closes the client's connection (and its own to the server): the
  client cannot tell whether it was applied. A request without a reply of its own (a
  STOMP SEND without a receipt, a PostgreSQL Parse) loses the next reply that confirms
  it (the RECEIPT of a later frame, the ReadyForQuery after the Sync);
* ``RESET``: the connection is closed before the request reaches the server (nothing
  of it applied);
* ``DELAY``: the request is held ``delay_s`` seconds, then forwarded (a slow server).

A fault fires ``times`` times (None: on every match) or on a seeded ``fraction`` of the
matches. Each injected fault is recorded in ``proxy.injected`` as (action, summary),
every summarised request in ``proxy.requests``. Everything else passes untouched, but
for Kafka's broker addresses, which the proxy rewrites to its own (one proxy per
broker: the tests' brokers are single nodes, and a broker's advertised address must
be the ``upstream`` the proxy was given).
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field

from .wireprotocols import KAFKA, POSTGRES, SESSIONS, STOMP, Session
from .wireproxy import DELAY, LOST_REPLY, RESET, FaultRules, Firing

ACTIONS = (LOST_REPLY, RESET, DELAY)
_CHUNK = 65536


@dataclass
class WireFault(Firing):
    action: str
    request: str
    """A regular expression searched in the request's summary."""
    _pattern: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown fault {self.action!r}; one of {ACTIONS}")
        self._pattern = re.compile(self.request)
        super().__post_init__()

    def fire(self, summary: str) -> bool:
        """Whether this request is hurt (and count it)."""
        return bool(self._pattern.search(summary)) and self.hurts()


class TcpFaultProxy(FaultRules[WireFault]):
    """The proxy, on a free port of ``listen_host``, in threads of this process."""

    def __init__(self, upstream: str, protocol: str, listen_host: str = "127.0.0.1") -> None:
        if protocol not in SESSIONS:
            raise ValueError(f"unknown protocol {protocol!r}; one of {sorted(SESSIONS)}")
        host, _, port = upstream.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"TcpFaultProxy forwards to host:port, not {upstream!r}")
        super().__init__("sparkeos-tcp-fault-proxy")
        self.upstream = (host.strip("[]"), int(port))
        self.protocol = protocol
        self.injected: list[tuple[str, str]] = []
        self.requests: list[str] = []
        """Every summarised request, in order."""
        self.sessions: list[Session] = []
        self._links: set[_Link] = set()
        self._server = socket.create_server((listen_host, 0))

    @property
    def host(self) -> str:
        return str(self._server.getsockname()[0])

    @property
    def port(self) -> int:
        return int(self._server.getsockname()[1])

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self) -> None:
        """Stop listening and close every connection still open."""
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            link.close()

    def choose(self, summary: str) -> WireFault | None:
        """The fault for this request, if one fires (recorded)."""
        with self._lock:
            self.requests.append(summary)
            for fault in self.faults:
                if fault.fire(summary):
                    self.injected.append((fault.action, summary))
                    return fault
        return None

    def _serve(self) -> None:  # accept connections
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # stopped
            try:
                upstream = socket.create_connection(self.upstream, timeout=30)
            except OSError:
                client.close()  # as the server would: nothing listens
                continue
            upstream.settimeout(None)
            for sock in (client, upstream):
                # Frames go on as they are cut: Nagle's delay would add ~40 ms to
                # every round trip of a chatty protocol.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            session = SESSIONS[self.protocol](self.upstream, (self.host, self.port))
            link = _Link(self, client, upstream, session)
            with self._lock:
                self._links.add(link)
                self.sessions.append(session)
            link.start()

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)


class _Link:
    """One client connection and the proxy's connection to the server for it."""

    def __init__(self, proxy: TcpFaultProxy, client: socket.socket, server: socket.socket,
                 session: Session) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.session = session
        self.doomed: Hashable | None = None
        """The token of the reply to swallow before closing (a LOST_REPLY)."""
        self.doom_next = False
        """A LOST_REPLY hit a request without a reply of its own: lose the next one."""
        self._closed = False
        self._lock = threading.Lock()

    def start(self) -> None:
        for pump, name in ((self._requests, "requests"), (self._replies, "replies")):
            threading.Thread(target=pump, name=f"sparkeos-tcp-fault-proxy-{name}",
                             daemon=True).start()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for sock in (self.client, self.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the other pump's recv
            except OSError:
                pass
            sock.close()
        self.proxy._forget(self)

    def _requests(self) -> None:
        buffer = bytearray()
        try:
            while data := self.client.recv(_CHUNK):
                buffer += data
                while (request := self.session.request(buffer)) is not None:
                    if request.answer is not None:
                        self.client.sendall(request.answer)
                        continue
                    fault = (self.proxy.choose(request.summary)
                             if request.summary is not None else None)
                    action = fault.action if fault is not None else None
                    if fault is not None and action == DELAY:
                        time.sleep(fault.delay_s)  # a slow server: then forwarded
                    if action == RESET:
                        return
                    # Before forwarding: the reply may come back at once.
                    if action == LOST_REPLY or (self.doom_next and request.reply is not None):
                        self.doomed, self.doom_next = request.reply, request.reply is None
                    self.server.sendall(request.raw)
        except OSError:
            pass
        finally:
            self.close()

    def _replies(self) -> None:
        buffer = bytearray()
        try:
            while data := self.server.recv(_CHUNK):
                buffer += data
                while (reply := self.session.reply(buffer)) is not None:
                    if self.doomed is not None and reply.belongs == self.doomed:
                        if reply.ends:
                            return  # applied, and the client never hears of it
                        continue
                    self.client.sendall(reply.raw)
        except OSError:
            pass
        finally:
            self.close()


__all__ = ["ACTIONS", "DELAY", "KAFKA", "LOST_REPLY", "POSTGRES", "RESET", "STOMP", "TcpFaultProxy",
           "WireFault"]
