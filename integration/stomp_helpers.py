"""Small STOMP helpers for tests against the real brokers of integration/fixtures/stomp.py.

URLs look like ``stomp://admin:admin@127.0.0.1:29613`` (``?vhost=/`` for RabbitMQ: the
CONNECT ``host`` header). Every helper opens its own STOMP 1.2 connection (stomp.py
``Connection12``, heartbeats off) and closes it with a confirmed DISCONNECT.

The broker kind is read from the CONNECTED frame's ``server`` header: on Artemis, SENDs get
``destination-type:ANYCAST`` and SUBSCRIBEs ``subscription-type:ANYCAST`` (a bare queue
name is otherwise a MULTICAST address there). ``/queue/<name>`` works on all three brokers
(the local Artemis has ``anycastPrefix=/queue/``); bare names work on Artemis only.

Queue depths without timing: ``queue_depth_artemis`` (the broker's own counters, via
its management address, over STOMP), ``queue_depth_classic`` (a STOMP queue browser:
ActiveMQ Classic sends every message still in the queue, then a ``browser:end`` frame),
``queue_depth_rabbitmq`` (``rabbitmqctl list_queues`` via docker/services/rabbitmq.sh). All
three count messages that are delivered but not yet acknowledged too.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import stomp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVICES = os.path.join(ROOT, "docker", "services")


@dataclass(frozen=True)
class StompTarget:
    host: str
    port: int
    user: str | None
    password: str | None
    vhost: str | None


def parse_url(url: str) -> StompTarget:
    parts = urlsplit(url)
    if parts.scheme != "stomp" or not parts.hostname or not parts.port:
        raise ValueError(f"not a stomp://[user:password@]host:port[?vhost=...] URL: {url!r}")
    vhost = parse_qs(parts.query).get("vhost", [None])[0]
    return StompTarget(
        host=parts.hostname,
        port=parts.port,
        user=unquote(parts.username) if parts.username is not None else None,
        password=unquote(parts.password) if parts.password is not None else None,
        vhost=vhost,
    )


@dataclass
class Message:
    headers: dict[str, str]
    body: str

    @property
    def message_id(self) -> str:
        return self.headers.get("message-id", "")


class StompError(RuntimeError):
    """The broker sent an ERROR frame."""


@dataclass
class _Listener(stomp.ConnectionListener):  # type: ignore[misc]
    messages: queue.Queue[Message] = field(default_factory=queue.Queue)
    receipts: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    server: str = ""
    cond: threading.Condition = field(default_factory=threading.Condition)

    def on_connected(self, frame: Any) -> None:
        self.server = frame.headers.get("server", "")

    def on_message(self, frame: Any) -> None:
        self.messages.put(Message(dict(frame.headers), frame.body))

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.receipts.add(frame.headers.get("receipt-id", ""))
            self.cond.notify_all()

    def on_error(self, frame: Any) -> None:
        with self.cond:
            self.errors.append(f"{frame.headers.get('message', '')} {frame.body or ''}".strip())
            self.cond.notify_all()

    def wait_receipt(self, receipt: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while receipt not in self.receipts:
                if self.errors:
                    raise StompError("; ".join(self.errors))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no RECEIPT {receipt} within {timeout} s")
                self.cond.wait(left)


class _Session:
    """A connected Connection12 with its listener; ``close`` is a confirmed DISCONNECT."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        target = parse_url(url)
        self.timeout = timeout
        self.listener = _Listener()
        self.conn = stomp.Connection12([(target.host, target.port)], heartbeats=(0, 0),
                                       vhost=target.vhost, timeout=timeout)
        self.conn.set_listener("helpers", self.listener)
        self.conn.connect(target.user, target.password, wait=True, with_connect_command=True)

    @property
    def artemis(self) -> bool:
        return "artemis" in self.listener.server.lower()

    def receipt(self) -> str:
        return f"r-{uuid.uuid4().hex[:12]}"

    def close(self) -> None:
        if self.conn.is_connected():
            self.conn.disconnect(receipt=self.receipt())

    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def server_of(url: str) -> str:
    """The broker's ``server`` header (e.g. ``ActiveMQ-Artemis/2.56.0 ...``)."""
    with _Session(url) as session:
        return session.listener.server


def send(url: str, destination: str, bodies: Iterable[str],
         headers: Mapping[str, str] | Sequence[Mapping[str, str]] | None = None,
         persistent: bool = True, timeout: float = 10.0) -> None:
    """SEND each body to ``destination``; the last frame carries a receipt, awaited (so
    every SEND before it was processed too). ``headers`` is one dict for all messages or
    one dict per message (e.g. a ``_AMQ_DUPL_ID`` each). Raises StompError on an ERROR."""
    bodies = list(bodies)
    if headers is None or isinstance(headers, Mapping):
        per_message: list[Mapping[str, str]] = [headers or {}] * len(bodies)
    else:
        per_message = list(headers)
        if len(per_message) != len(bodies):
            raise ValueError("one headers dict per body, or one for all")
    with _Session(url, timeout) as session:
        receipt = session.receipt()
        for i, (body, extra) in enumerate(zip(bodies, per_message, strict=True)):
            frame_headers: dict[str, str] = {}
            if persistent:
                frame_headers["persistent"] = "true"
            if session.artemis:
                frame_headers["destination-type"] = "ANYCAST"
            frame_headers.update(extra)
            if i == len(bodies) - 1:
                frame_headers["receipt"] = receipt
            session.conn.send(destination, body, headers=frame_headers)
        if bodies:
            session.listener.wait_receipt(receipt, timeout)


def drain(url: str, destination: str, expect: int | None = None, idle: float = 1.0,
          timeout: float = 30.0, ack: bool = True) -> list[Message]:
    """Receive (client-individual) what is in ``destination`` now and return it in order.

    Stops once ``expect`` messages arrived (if given), else when nothing came for ``idle``
    seconds, or after ``timeout`` seconds in all. With ``ack`` each message is ACKed (the
    ACKs are confirmed by the DISCONNECT receipt); without, they go back to the queue."""
    out: list[Message] = []
    with _Session(url) as session:
        sub_headers = {"subscription-type": "ANYCAST"} if session.artemis else {}
        sub_id = f"drain-{uuid.uuid4().hex[:8]}"
        session.conn.subscribe(destination, id=sub_id, ack="client-individual",
                               headers=sub_headers)
        deadline = time.monotonic() + timeout
        while expect is None or len(out) < expect:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                message = session.listener.messages.get(timeout=min(idle, left))
            except queue.Empty:
                if expect is None:
                    break
                continue
            if ack:
                session.conn.ack(message.headers["ack"])
            out.append(message)
        if session.listener.errors:
            raise StompError("; ".join(session.listener.errors))
        receipt = session.receipt()
        session.conn.unsubscribe(sub_id, headers={"receipt": receipt})
        session.listener.wait_receipt(receipt, session.timeout)
    return out


def _script(name: str, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", os.path.join(SERVICES, name), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _stat_fields(line: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in line.split())


STAT_FIELDS = {"messageCount": "messageCount", "deliveringCount": "deliveringCount",
               "consumerCount": "consumerCount", "messagesAdded": "messagesAdded",
               "messagesAcked": "messagesAcknowledged", "scheduledCount": "scheduledCount"}
"""The counters ``queue_stat_artemis`` returns, by the name of Artemis' attribute."""

MANAGEMENT_ADDRESS = "activemq.management"


def queue_stat_artemis(name: str, url: str,
                       fields: tuple[str, ...] = tuple(STAT_FIELDS)) -> dict[str, str]:
    """The counters ``fields`` (of STAT_FIELDS) of the ANYCAST queue ``name`` on the
    Artemis at ``url``, with ``name``, read through the broker's management address
    over STOMP: a message naming the resource (``queue.<name>``) and the attribute,
    answered on a reply queue of this call. Milliseconds, where the ``artemis`` CLI
    started a JVM each time (3 s of a core). LookupError if there is no such queue."""
    with _Session(url) as session:
        reply = f"mgmt-reply-{uuid.uuid4().hex[:12]}"
        session.conn.subscribe(reply, id=reply, ack="auto",
                               headers={"subscription-type": "ANYCAST"})

        def read(resource: str, attribute: str) -> Any:
            session.conn.send(MANAGEMENT_ADDRESS, "", headers={
                "_AMQ_ResourceName": resource, "_AMQ_Attribute": attribute,
                "reply-to": reply, "destination-type": "ANYCAST"})
            try:
                answer = session.listener.messages.get(timeout=session.timeout)
            except queue.Empty:
                refused = "; ".join(session.listener.errors)  # e.g. no manage permission
                raise TimeoutError(f"Artemis at {url} did not answer {resource}.{attribute} "
                                   f"within {session.timeout} s"
                                   + (f": {refused}" if refused else "")) from None
            (value,) = json.loads(answer.body)
            if answer.headers.get("_AMQ_OperationSucceeded") != "true":
                raise RuntimeError(f"Artemis at {url}: reading {resource}.{attribute} "
                                   f"failed: {value}")
            return value

        def missing() -> LookupError:
            return LookupError(f"no queue {name!r} on Artemis at {url}")

        if name not in read("broker", "queueNames"):
            raise missing()
        try:
            stats = {key: str(read(f"queue.{name}", STAT_FIELDS[key])) for key in fields}
        except RuntimeError:
            # Removed meanwhile (the broker deletes an auto-created queue once drained)?
            if name not in read("broker", "queueNames"):
                raise missing() from None
            raise
    return {"name": name, **stats}


def queue_depth_artemis(name: str, url: str) -> int:
    """Messages in queue ``name`` on the Artemis at ``url``,
    including delivered but unacknowledged ones; LookupError if the queue does not exist."""
    return int(queue_stat_artemis(name, url, ("messageCount",))["messageCount"])


def queue_depth_rabbitmq(name: str) -> int:
    """Messages (ready + unacknowledged) in queue ``name`` of vhost / on the local
    RabbitMQ; LookupError if the queue does not exist."""
    result = _script("rabbitmq.sh", "queue-stat", name)
    if result.returncode == 4:
        raise LookupError(f"no queue {name!r} on RabbitMQ")
    if result.returncode != 0:
        raise RuntimeError(f"rabbitmq.sh queue-stat failed:\n{result.stderr[-2000:]}")
    return int(_stat_fields(result.stdout.strip())["messages"])


def queue_depth_classic(url: str, destination: str, timeout: float = 10.0) -> int:
    """Messages in ``destination`` (``/queue/<name>``) on ActiveMQ Classic, counted with a
    STOMP queue browser (``browser:true``): the broker sends a copy of each message still
    in the queue (delivered-but-unacked ones too), then an empty ``browser:end`` message.
    Consumes nothing. A queue that does not exist counts 0."""
    count = 0
    with _Session(url, timeout) as session:
        sub_id = f"browse-{uuid.uuid4().hex[:8]}"
        session.conn.subscribe(destination, id=sub_id, ack="auto", headers={"browser": "true"})
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no browser:end from {destination} within {timeout} s")
            try:
                message = session.listener.messages.get(timeout=left)
            except queue.Empty:
                continue
            if message.headers.get("browser") == "end":
                break
            count += 1
        session.conn.unsubscribe(sub_id)
    return count
