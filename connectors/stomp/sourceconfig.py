"""The STOMP source's settings, :class:`StompSourceConfig`: checked at construction,
handed to Spark's data source as one option string (``encode``/``from_options``).

A module of its own so the runner's modules (``runtime``, ``connection``, ``seen``,
``messages``) can import it without importing ``source``, which imports them.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sparkeos.core.errors import ConfigurationError

from .client import Endpoint, redact_url

SPOOL_ENV = "SPARKEOS_STOMP_SPOOL_DIR"
FORMAT_NAME = "sparkeos-stomp"
BODY_FORMATS = ("binary", "string", "json")
ON_BAD_MESSAGE = ("fail", "dead-letter")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def default_spool_root() -> str:
    configured = os.environ.get(SPOOL_ENV)
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    return os.path.join(os.path.expanduser("~"), ".sparkeos", "stomp-spool")


@dataclass(frozen=True)
class StompSourceConfig:
    """Settings of :func:`stomp_source` (validated at construction).

    ``message_id_header`` / ``message_id_fn(headers) -> str``: where a message's stable
    ID comes from; default: the broker's own ``message-id`` where it is stable (Artemis:
    the part after the comma; ActiveMQ Classic: all of it). RabbitMQ changes
    ``message-id`` on every delivery: set one of the two. ``require_ids``: a message
    without a usable ID is an error (exactly-once); False lets it through undeduplicated.
    """

    url: str
    destination: str
    name: str | None = None
    spool_dir: str | None = None
    passcode: str | None = field(default=None, repr=False)
    message_id_header: str | None = None
    message_id_fn: Callable[[Mapping[str, str]], str | None] | None = None
    require_ids: bool = True
    body_format: str = "binary"
    on_bad_message: str = "fail"
    dead_letter_destination: str | None = None
    max_batch_messages: int = 10_000
    partition_messages: int = 50_000
    max_seen_ids: int = 1_000_000
    poll_timeout_s: float = 2.0
    idle_timeout_s: float = 0.2
    timeout_s: float = 30.0
    subscription_type: str | None = "ANYCAST"
    ssl_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    connect_headers: Mapping[str, str] = field(default_factory=dict)
    heartbeats: tuple[int, int] = (0, 0)
    fsync: bool = True

    def __post_init__(self) -> None:
        Endpoint.parse(self.url, passcode=self.passcode)
        if not self.destination:
            raise ConfigurationError("stomp_source needs a destination",
                                     fix="stomp_source(spark, url, 'orders')")
        if self.body_format not in BODY_FORMATS:
            raise ConfigurationError(f"unknown body_format {self.body_format!r}",
                                     fix=f"use one of {', '.join(BODY_FORMATS)}")
        if self.on_bad_message not in ON_BAD_MESSAGE:
            raise ConfigurationError(
                f"unknown on_bad_message {self.on_bad_message!r}",
                fix="use 'fail' (stop the query, the message stays on the broker) or "
                "'dead-letter' with dead_letter_destination=...",
            )
        if self.on_bad_message == "dead-letter" and not self.dead_letter_destination:
            raise ConfigurationError("on_bad_message='dead-letter' needs a destination",
                                     fix="stomp_source(..., dead_letter_destination='orders.dlq')")
        for name in ("max_batch_messages", "partition_messages", "max_seen_ids"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name}={value!r} must be a positive integer")
        if self.max_seen_ids < 2 * self.max_batch_messages:
            raise ConfigurationError(
                f"max_seen_ids={self.max_seen_ids} is below twice max_batch_messages="
                f"{self.max_batch_messages}: the IDs of one spooled and one redelivered "
                "batch would not fit", fix="raise max_seen_ids or lower max_batch_messages")
        for name in ("poll_timeout_s", "idle_timeout_s", "timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name}={getattr(self, name)!r} must be > 0")
        if self.name is not None and (not self.name or _UNSAFE.search(self.name)):
            raise ConfigurationError(f"invalid source name {self.name!r}",
                                     fix="use letters, digits, '.', '_' and '-'")
        object.__setattr__(self, "heartbeats", tuple(self.heartbeats))
        object.__setattr__(self, "ssl_options", dict(self.ssl_options))
        object.__setattr__(self, "connect_headers", dict(self.connect_headers))

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in fields(self)
                 if f.repr and f.name != "url"}
        return f"StompSourceConfig(url={redact_url(self.url)!r}, " + ", ".join(
            f"{k}={v!r}" for k, v in shown.items() if k != "url") + ")"

    @property
    def source_name(self) -> str:
        return self.name or _UNSAFE.sub("_", self.destination.strip("/"))

    @property
    def spool_path(self) -> str:
        if self.spool_dir:
            return os.path.abspath(os.path.expanduser(self.spool_dir))
        return os.path.join(default_spool_root(), self.source_name)

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint.parse(self.url, passcode=self.passcode)

    def schema(self) -> str:
        body = "binary" if self.body_format == "binary" else "string"
        return ("message_id string, destination string, headers map<string,string>, "
                f"body {body}, timestamp timestamp")

    def encode(self) -> str:
        from pyspark import cloudpickle

        return base64.b64encode(cloudpickle.dumps(self)).decode()  # type: ignore[no-untyped-call]

    @staticmethod
    def decode(text: str) -> StompSourceConfig:
        from pyspark import cloudpickle

        config = cloudpickle.loads(base64.b64decode(text))
        assert isinstance(config, StompSourceConfig)
        return config

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> StompSourceConfig:
        """From ``spark.readStream.format("sparkeos-stomp").option(...)`` strings."""
        if "secret_config" in options:
            return cls.decode(options["secret_config"])
        known = {f.name: f for f in fields(cls)}
        settings: dict[str, Any] = {}
        for key, raw in options.items():
            if key == "path":
                continue
            if key not in known or key in ("message_id_fn", "ssl_options", "connect_headers"):
                raise ConfigurationError(f"unknown option {key!r} of {FORMAT_NAME}",
                                         fix=f"options: {', '.join(sorted(known))}")
            default = known[key].default
            if isinstance(default, bool):
                settings[key] = raw.lower() in ("1", "true", "yes")
            elif isinstance(default, int):
                settings[key] = int(raw)
            elif isinstance(default, float):
                settings[key] = float(raw)
            else:
                settings[key] = raw
        return cls(**settings)


__all__ = ["BODY_FORMATS", "FORMAT_NAME", "ON_BAD_MESSAGE", "SPOOL_ENV", "StompSourceConfig",
           "default_spool_root"]
