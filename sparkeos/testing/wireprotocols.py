"""What ``TcpFaultProxy`` reads of each protocol: enough framing to know one request
and the reply to it.

A session (one per proxied connection) cuts the bytes of each direction into frames:

* ``request(buffer)`` takes the next complete frame the client sent off ``buffer`` (None
  until one is complete) as a ``Request``: its bytes, a one-line ``summary`` that
  faults match (None: never hurt), and the ``reply`` token of the answer it expects;
* ``reply(buffer)`` does the same for the server's side: a ``Reply`` names the request
  token it answers (``belongs``) and whether it is that answer's last frame (``ends``).

A session registers a request's token while it cuts the frame, before the proxy
forwards it, so the reply is always recognised.

PostgreSQL (frontend/backend protocol 3)
    The startup packet has no type byte. An SSLRequest or GSSENCRequest is answered
    ``N`` by the proxy itself (libpq's default ``sslmode=prefer`` then goes on in
    plaintext on the same connection), so every later message can be read. A simple
    Query is summarised by its SQL, a Parse by its statement; a Query, a Sync and a
    function call each expect a reply that ends with ReadyForQuery (``Z``), which the
    backend sends in order.
Kafka
    Size-prefixed frames; a request header starts with api_key, api_version and
    correlation_id, a response with the correlation_id. Summary ``<ApiName> v<version>``;
    EndTxn adds ``commit``/``abort`` and the transactional id. Brokers tell clients
    where they are (Metadata, FindCoordinator, DescribeCluster responses): the session
    rewrites its upstream's address there to the proxy's, else the client would go
    around the proxy after its first request.
STOMP
    Frames end with NUL (after ``content-length`` bytes of body when given); newlines
    between frames are heart-beats. Summary: the command and its headers, the passcode
    shown as ``***``. A frame with a ``receipt`` header expects the RECEIPT (or ERROR)
    naming it; CONNECT expects CONNECTED.
"""

from __future__ import annotations

import collections
import itertools
import struct
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

POSTGRES = "postgres"
KAFKA = "kafka"
STOMP = "stomp"

Address = tuple[str, int]


@dataclass(frozen=True)
class Request:
    raw: bytes
    summary: str | None = None
    """What a fault's pattern is searched in (None: this frame is never hurt)."""
    reply: Hashable | None = None
    """The token of the reply it expects (None: no reply of its own)."""
    answer: bytes | None = None
    """The proxy answers this itself and forwards nothing (PostgreSQL's SSLRequest)."""


@dataclass(frozen=True)
class Reply:
    raw: bytes
    belongs: Hashable | None = None
    """The token of the request this frame answers (None: unsolicited)."""
    ends: bool = False
    """The last frame of that answer."""


class Session(Protocol):
    def request(self, buffer: bytearray) -> Request | None: ...

    def reply(self, buffer: bytearray) -> Reply | None: ...


def _take(buffer: bytearray, size: int) -> bytes:
    raw = bytes(buffer[:size])
    del buffer[:size]
    return raw


# -- PostgreSQL --------------------------------------------------------------------------------
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102
_EXPECTS_READY = frozenset(b"QSF")
"""Query, Sync and FunctionCall: each answered up to a ReadyForQuery."""


class PostgresSession:
    def __init__(self, upstream: Address, listen: Address) -> None:
        self._started = False
        self._tokens = itertools.count()
        # Appended by the request side, popped by the reply side (deque: thread-safe).
        self._pending: collections.deque[int] = collections.deque()

    def request(self, buffer: bytearray) -> Request | None:
        if not self._started:
            return self._startup(buffer)
        if len(buffer) < 5:
            return None
        size = 1 + int.from_bytes(buffer[1:5], "big")
        if len(buffer) < size:
            return None
        raw = _take(buffer, size)
        kind = raw[0]
        if kind == ord("Q"):
            return self._expecting(raw, _cstring(raw, 5))
        if kind == ord("P"):  # Parse: statement name, then the SQL
            return Request(raw, _cstring(raw, raw.index(b"\0", 5) + 1))
        if kind in _EXPECTS_READY:
            return self._expecting(raw, None)
        return Request(raw)

    def _startup(self, buffer: bytearray) -> Request | None:
        if len(buffer) < 8:
            return None
        size = int.from_bytes(buffer[:4], "big")
        if len(buffer) < size:
            return None
        raw = _take(buffer, size)
        code = int.from_bytes(raw[4:8], "big")
        if code in (_SSL_REQUEST, _GSSENC_REQUEST):
            return Request(raw, answer=b"N")  # no encryption: the messages stay readable
        self._started = True
        if code == _CANCEL_REQUEST:
            return Request(raw, "CancelRequest")
        return self._expecting(raw, "StartupMessage")

    def _expecting(self, raw: bytes, summary: str | None) -> Request:
        token = next(self._tokens)
        self._pending.append(token)
        return Request(raw, summary, token)

    def reply(self, buffer: bytearray) -> Reply | None:
        if len(buffer) < 5:
            return None
        size = 1 + int.from_bytes(buffer[1:5], "big")
        if len(buffer) < size:
            return None
        raw = _take(buffer, size)
        belongs = self._pending[0] if self._pending else None
        if raw[0] == ord("Z") and belongs is not None:
            self._pending.popleft()
            return Reply(raw, belongs, ends=True)
        return Reply(raw, belongs)


def _cstring(raw: bytes, start: int) -> str:
    end = raw.index(b"\0", start)
    return raw[start:end].decode("utf-8", "replace").strip()


# -- Kafka ---------------------------------------------------------------------------------
KAFKA_APIS = {
    0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
    9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
    13: "LeaveGroup", 14: "SyncGroup", 15: "DescribeGroups", 17: "SaslHandshake",
    18: "ApiVersions", 19: "CreateTopics", 22: "InitProducerId", 24: "AddPartitionsToTxn",
    25: "AddOffsetsToTxn", 26: "EndTxn", 28: "TxnOffsetCommit", 32: "DescribeConfigs",
    36: "SaslAuthenticate", 60: "DescribeCluster", 71: "GetTelemetrySubscriptions",
    72: "PushTelemetry",
}
END_TXN = 26
_NAMES_BROKERS = frozenset({3, 10, 60})
"""Metadata, FindCoordinator and DescribeCluster: responses that give broker addresses."""


class KafkaSession:
    def __init__(self, upstream: Address, listen: Address) -> None:
        self._apis: dict[int, int] = {}
        """Correlation id -> api key of the requests not answered yet."""
        self._replacements = _address_replacements(upstream, listen)
        self.rewritten = 0
        """Broker addresses rewritten to the proxy's (for a test's diagnostics)."""

    def request(self, buffer: bytearray) -> Request | None:
        raw = _sized(buffer)
        if raw is None:
            return None
        api_key, version, correlation = struct.unpack_from(">hhi", raw, 4)
        self._apis[correlation] = api_key
        summary = f"{KAFKA_APIS.get(api_key, f'api{api_key}')} v{version}"
        if api_key == END_TXN:
            summary += " " + _end_txn(raw, version)
        return Request(raw, summary, correlation)

    def reply(self, buffer: bytearray) -> Reply | None:
        raw = _sized(buffer)
        if raw is None:
            return None
        (correlation,) = struct.unpack_from(">i", raw, 4)
        if self._apis.pop(correlation, None) in _NAMES_BROKERS:
            raw = self._rewrite(raw)
        return Reply(raw, correlation, ends=True)

    def _rewrite(self, raw: bytes) -> bytes:
        body = raw[4:]
        for old, new in self._replacements:
            self.rewritten += body.count(old)
            body = body.replace(old, new)
        return len(body).to_bytes(4, "big") + body


def _address_replacements(upstream: Address, listen: Address) -> list[tuple[bytes, bytes]]:
    """The upstream's (host, port) as a broker entry encodes it, and the proxy's: a
    string (int16 length; in flexible versions a compact string, its length + 1 as an
    unsigned varint) right before the int32 port. Host strings are not inside any
    length-counted section of these responses, so a host of another length only
    changes the frame's size."""
    pairs = []
    for (host, port) in (upstream, listen):
        name = host.encode()
        if len(name) + 1 >= 0x80:
            raise ValueError(f"host name {host!r} is too long for the proxy's rewrite")
        pairs.append((struct.pack(">h", len(name)) + name + struct.pack(">i", port),
                      bytes([len(name) + 1]) + name + struct.pack(">i", port)))
    (plain_old, compact_old), (plain_new, compact_new) = pairs
    return [(plain_old, plain_new), (compact_old, compact_new)]


def _sized(buffer: bytearray) -> bytes | None:
    if len(buffer) < 4:
        return None
    size = 4 + int.from_bytes(buffer[:4], "big")
    return _take(buffer, size) if len(buffer) >= size else None


def _end_txn(raw: bytes, version: int) -> str:
    """``commit <transactional id>`` or ``abort <transactional id>``."""
    flexible = version >= 3  # EndTxn's flexible versions: request header v2
    offset = 12
    (client_id,) = struct.unpack_from(">h", raw, offset)
    offset += 2 + max(client_id, 0)
    if flexible:
        offset = _skip_tagged_fields(raw, offset)
        length, offset = _uvarint(raw, offset)
        length -= 1
    else:
        (length,) = struct.unpack_from(">h", raw, offset)
        offset += 2
    transactional_id = raw[offset:offset + length].decode("utf-8", "replace")
    offset += length + 8 + 2  # producer id, producer epoch
    return f"{'commit' if raw[offset] else 'abort'} {transactional_id}"


def _uvarint(raw: bytes, offset: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = raw[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7


def _skip_tagged_fields(raw: bytes, offset: int) -> int:
    count, offset = _uvarint(raw, offset)
    for _ in range(count):
        _tag, offset = _uvarint(raw, offset)
        size, offset = _uvarint(raw, offset)
        offset += size
    return offset


# -- STOMP ---------------------------------------------------------------------------------
_CONNECT = ("connect",)


class StompSession:
    def __init__(self, upstream: Address, listen: Address) -> None:
        pass

    def request(self, buffer: bytearray) -> Request | None:
        frame = _stomp_frame(buffer)
        if frame is None:
            return None
        raw, command, headers = frame
        if command is None:
            return Request(raw)  # heart-beats
        token: Hashable | None = None
        if "receipt" in headers:
            token = ("receipt", headers["receipt"])
        elif command in ("CONNECT", "STOMP"):
            token = _CONNECT
        shown = " ".join(f"{k}:{'***' if k == 'passcode' else v}" for k, v in headers.items())
        return Request(raw, f"{command} {shown}".strip(), token)

    def reply(self, buffer: bytearray) -> Reply | None:
        frame = _stomp_frame(buffer)
        if frame is None:
            return None
        raw, command, headers = frame
        if command in ("RECEIPT", "ERROR") and "receipt-id" in headers:
            return Reply(raw, ("receipt", headers["receipt-id"]), ends=True)
        if command == "CONNECTED":
            return Reply(raw, _CONNECT, ends=True)
        return Reply(raw)


def _stomp_frame(buffer: bytearray) -> tuple[bytes, str | None, dict[str, str]] | None:
    """The next frame: (bytes, command, headers); command None for heart-beats."""
    beats = len(buffer) - len(buffer.lstrip(b"\r\n"))
    if beats:
        return _take(buffer, beats), None, {}
    ends = [(i, i + len(sep)) for sep in (b"\n\n", b"\n\r\n")
            if (i := buffer.find(sep)) >= 0]
    if not ends:
        return None
    head_end, body_start = min(ends)
    lines = bytes(buffer[:head_end]).decode("utf-8", "replace").split("\n")
    command = lines[0].strip("\r")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.rstrip("\r").partition(":")
        headers.setdefault(name, value)  # STOMP 1.2: the first of repeated headers counts
    if "content-length" in headers:
        end = body_start + int(headers["content-length"])
        if len(buffer) <= end:
            return None
    else:
        end = buffer.find(b"\0", body_start)
        if end < 0:
            return None
    return _take(buffer, end + 1), command, headers


SESSIONS: dict[str, type[PostgresSession] | type[KafkaSession] | type[StompSession]] = {
    POSTGRES: PostgresSession, KAFKA: KafkaSession, STOMP: StompSession,
}

__all__ = ["KAFKA", "KAFKA_APIS", "POSTGRES", "SESSIONS", "STOMP", "Reply", "Request",
           "Session"]
