"""The TCP fault proxy's framing of PostgreSQL, Kafka and STOMP, and its faults, against
toy servers (the real destinations: the wire-fault conformance cases)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from sparkeos.testing.tcpproxy import DELAY, LOST_REPLY, RESET, STOMP, TcpFaultProxy, WireFault
from sparkeos.testing.wireprotocols import KafkaSession, PostgresSession, StompSession

UPSTREAM = ("127.0.0.1", 29092)
LISTEN = ("127.0.0.1", 41234)


def pg_message(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack(">i", 4 + len(payload)) + payload


def test_postgres_ssl_request_is_answered_no_and_queries_are_summarised() -> None:
    session = PostgresSession(UPSTREAM, LISTEN)
    buffer = bytearray(struct.pack(">ii", 8, 80877103))
    ssl = session.request(buffer)
    assert ssl is not None and ssl.answer == b"N" and not buffer
    startup = struct.pack(">i", 196608) + b"user\0sparkeos\0\0"
    buffer += struct.pack(">i", 4 + len(startup)) + startup
    buffer += pg_message(b"Q", b"COMMIT PREPARED 'g1'\0")
    buffer += pg_message(b"P", b"stmt\0PREPARE TRANSACTION 'g2'\0\0\0")[:-2]  # incomplete
    first, query = session.request(buffer), session.request(buffer)
    assert first is not None and first.summary == "StartupMessage"
    assert query is not None and query.summary == "COMMIT PREPARED 'g1'"
    assert session.request(buffer) is None  # waits for the rest of the Parse
    # The replies end in order: the startup's ReadyForQuery, then the query's.
    replies = bytearray(pg_message(b"Z", b"I") + pg_message(b"C", b"COMMIT PREPARED\0")
                        + pg_message(b"Z", b"I"))
    ready, complete, done = (session.reply(replies) for _ in range(3))
    assert ready is not None and ready.belongs == first.reply and ready.ends
    assert complete is not None and complete.belongs == query.reply and not complete.ends
    assert done is not None and done.belongs == query.reply and done.ends


def end_txn(version: int, transactional_id: str, commit: bool) -> bytes:
    name = transactional_id.encode()
    header = struct.pack(">hhih", 26, version, 7, 4) + b"test"
    if version >= 3:  # flexible: header tagged fields, a compact string
        body = b"\0" + bytes([len(name) + 1]) + name
    else:
        body = struct.pack(">h", len(name)) + name
    body += struct.pack(">qh?", 1000, 3, commit)
    frame = header + body
    return struct.pack(">i", len(frame)) + frame


@pytest.mark.parametrize("version", [1, 4])
def test_kafka_end_txn_is_summarised_with_its_outcome(version: int) -> None:
    session = KafkaSession(UPSTREAM, LISTEN)
    buffer = bytearray(end_txn(version, "seos-t-1", True) + end_txn(version, "seos-t-1", False))
    commit, abort = session.request(buffer), session.request(buffer)
    assert commit is not None and commit.summary == f"EndTxn v{version} commit seos-t-1"
    assert abort is not None and abort.summary == f"EndTxn v{version} abort seos-t-1"
    assert commit.reply == 7


def test_kafka_broker_addresses_are_rewritten_to_the_proxy() -> None:
    session = KafkaSession(("kafka-1", 29092), ("127.0.0.1", 41234))
    metadata = struct.pack(">hhih", 3, 12, 5, 0)
    session.request(bytearray(struct.pack(">i", len(metadata)) + metadata))
    # A flexible Metadata response: one broker (node 1, compact host, port, rack).
    body = struct.pack(">ib", 5, 0) + b"\2" + struct.pack(">i", 1) + b"\x08kafka-1" + \
        struct.pack(">i", 29092) + b"\0\0"
    reply = session.reply(bytearray(struct.pack(">i", len(body)) + body))
    assert reply is not None and reply.ends and reply.belongs == 5
    assert b"\x0a127.0.0.1" + struct.pack(">i", 41234) in reply.raw
    assert struct.unpack(">i", reply.raw[:4])[0] == len(reply.raw) - 4 == len(body) + 2
    assert session.rewritten == 1


def test_stomp_frames_heartbeats_and_receipts() -> None:
    session = StompSession(UPSTREAM, LISTEN)
    buffer = bytearray(b"\n\r\nCONNECT\nlogin:admin\npasscode:secret\n\n\0"
                       b"SEND\ndestination:q\ncontent-length:3\nreceipt:r1\n\na\0b\0")
    beats, connect, send = (session.request(buffer) for _ in range(3))
    assert beats is not None and beats.summary is None
    assert connect is not None and "secret" not in (connect.summary or "")
    assert send is not None and send.summary == "SEND destination:q content-length:3 receipt:r1"
    assert not buffer
    replies = bytearray(b"MESSAGE\ndestination:q\n\nx\0RECEIPT\nreceipt-id:r1\n\n\0")
    message, receipt = session.reply(replies), session.reply(replies)
    assert message is not None and message.belongs is None
    assert receipt is not None and receipt.belongs == send.reply and receipt.ends


class ReceiptServer:
    """A toy STOMP server: answers every frame with a receipt by its RECEIPT, and keeps
    the commands it got."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._server.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        session = StompSession(UPSTREAM, LISTEN)
        buffer = bytearray()
        with conn:
            while data := conn.recv(4096):
                buffer += data
                while (request := session.request(buffer)) is not None:
                    if request.summary is None:
                        continue
                    self.received.append(request.summary)
                    if isinstance(request.reply, tuple) and request.reply[0] == "receipt":
                        conn.sendall(f"RECEIPT\nreceipt-id:{request.reply[1]}\n\n\0".encode())

    def close(self) -> None:
        self._server.close()


@pytest.fixture
def server() -> Iterator[ReceiptServer]:
    toy = ReceiptServer()
    yield toy
    toy.close()


def send(address: str, frame: bytes) -> bytes:
    """Send one frame; what comes back before the connection closes (or 2 s pass)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2) as conn:
        conn.sendall(frame)
        answer = b""
        try:
            while data := conn.recv(4096):
                answer += data
                if answer.endswith(b"\0"):
                    break
        except (TimeoutError, ConnectionResetError):
            pass
        return answer


def test_a_lost_reply_is_applied_and_never_answered(server: ReceiptServer) -> None:
    with TcpFaultProxy(server.address, STOMP) as proxy:
        proxy.add(WireFault(LOST_REPLY, r"^SEND .*receipt:r1"))
        assert send(proxy.address, b"SEND\ndestination:q\nreceipt:r1\n\nx\0") == b""
        assert send(proxy.address, b"SEND\ndestination:q\nreceipt:r1\n\nx\0").startswith(
            b"RECEIPT")  # one-shot: the second goes through
    assert server.received == ["SEND destination:q receipt:r1"] * 2
    assert proxy.injected == [(LOST_REPLY, "SEND destination:q receipt:r1")]


def test_a_reset_never_reaches_the_server(server: ReceiptServer) -> None:
    with TcpFaultProxy(server.address, STOMP) as proxy:
        proxy.add(WireFault(RESET, r"^SEND"))
        assert send(proxy.address, b"SEND\ndestination:q\nreceipt:r1\n\nx\0") == b""
    assert server.received == []
    assert proxy.injected == [(RESET, "SEND destination:q receipt:r1")]


def test_a_delayed_request_is_forwarded_after_its_delay(server: ReceiptServer) -> None:
    with TcpFaultProxy(server.address, STOMP) as proxy:
        proxy.add(WireFault(DELAY, r"^SEND", delay_s=0.3))
        started = time.monotonic()
        answer = send(proxy.address, b"SEND\ndestination:q\nreceipt:r1\n\nx\0")
        held = time.monotonic() - started
    assert answer.startswith(b"RECEIPT") and held >= 0.3  # a sleep lasts at least that
    assert server.received == ["SEND destination:q receipt:r1"]
    assert proxy.injected == [(DELAY, "SEND destination:q receipt:r1")]


def test_a_lost_reply_without_its_own_receipt_loses_the_next_one(server: ReceiptServer
                                                                 ) -> None:
    with TcpFaultProxy(server.address, STOMP) as proxy:
        proxy.add(WireFault(LOST_REPLY, r"^SEND destination:a"))
        answer = send(proxy.address, b"SEND\ndestination:a\n\nx\0"
                                     b"SEND\ndestination:b\nreceipt:r2\n\ny\0")
    assert answer == b""
    assert server.received == ["SEND destination:a", "SEND destination:b receipt:r2"]


def test_a_seeded_fraction_hurts_the_same_requests_every_run() -> None:
    def hurt() -> list[bool]:
        fault = WireFault(LOST_REPLY, "^SEND", fraction=0.5, seed=3)
        return [fault.fire("SEND x") for _ in range(20)]

    first = hurt()
    assert first == hurt() and 0 < sum(first) < 20


def test_the_http_proxy_holds_a_delayed_request_then_forwards_it() -> None:
    """``wireproxy.FaultProxy``'s ``DELAY``, against a toy HTTP server."""
    import http.server
    import urllib.request

    from sparkeos.testing.wireproxy import DELAY as HTTP_DELAY
    from sparkeos.testing.wireproxy import Fault, FaultProxy

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        with FaultProxy(f"http://127.0.0.1:{upstream.server_address[1]}") as proxy:
            proxy.add(Fault(HTTP_DELAY, method="GET", delay_s=0.3))
            started = time.monotonic()
            with urllib.request.urlopen(f"{proxy.endpoint}/x", timeout=10) as answer:
                body = answer.read()
            held = time.monotonic() - started
        assert body == b"ok" and held >= 0.3
        assert proxy.injected == [(HTTP_DELAY, "GET", "/x")]
    finally:
        upstream.shutdown()
        upstream.server_close()
