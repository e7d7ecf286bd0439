"""StompSink's validated configuration: the settings checks made at construction, their
normal forms, and the rebuild of a sink from its recorded description.

The sink's dataclass fields are its public constructor; this module decides which
combinations are refused (before anything reaches a broker) and how the accepted ones
are stored, so a sink shipped to a task carries plain, already-checked values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol

from sparkeos.core.config import Guarantee
from sparkeos.core.errors import ConfigurationError
from sparkeos.core.storage.registry import resolve_location
from sparkeos.core.text.records import check_payload_format

from .client import Endpoint
from .staging import default_staging_dir

DUPLICATE_DETECTION = ("broker", "consumer", "none")
ARTEMIS_DUPLICATE_HEADER = "_AMQ_DUPL_ID"
DEFAULT_DEDUP_HEADER = "sparkeos-dedup-id"
_RESERVED_HEADERS = frozenset({"destination", "transaction", "receipt", "content-length",
                               "persistent", ARTEMIS_DUPLICATE_HEADER.lower()})


class SinkSettings(Protocol):
    """The constructor fields of ``StompSink`` these checks read: spelled out here, not
    imported, because ``sink`` imports this module. Read-only properties so a frozen
    dataclass matches."""

    @property
    def url(self) -> str: ...
    @property
    def passcode(self) -> str | None: ...
    @property
    def destination(self) -> str | None: ...
    @property
    def destination_column(self) -> str | None: ...
    @property
    def body_column(self) -> str | None: ...
    @property
    def body_format(self) -> str | None: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def duplicate_detection(self) -> str: ...
    @property
    def id_cache_size(self) -> int: ...
    @property
    def dedup_header(self) -> str: ...
    @property
    def ssl_options(self) -> Mapping[str, Any]: ...
    @property
    def connect_headers(self) -> Mapping[str, str]: ...
    @property
    def heartbeats(self) -> tuple[int, int]: ...
    @property
    def staging_dir(self) -> str | None: ...
    @property
    def timeout_s(self) -> float: ...


def checked_settings(sink: SinkSettings) -> dict[str, Any]:
    """Check ``sink``'s settings (``ConfigurationError`` naming the fix) and return the
    attributes to store in their normal form, the parsed endpoint as ``_endpoint``."""
    endpoint = Endpoint.parse(sink.url, passcode=sink.passcode)
    _check_target(sink)
    _check_limits(sink)
    clash = sorted(k for k in sink.headers if k.lower() in _RESERVED_HEADERS
                   or k == sink.dedup_header)
    if clash:
        raise ConfigurationError(f"headers sets {', '.join(clash)}, which StompSink "
                                 "manages", fix="leave them out of headers=")
    settings: dict[str, Any] = {
        "headers": {str(k): str(v) for k, v in sink.headers.items()},
        "ssl_options": dict(sink.ssl_options),
        "connect_headers": dict(sink.connect_headers),
        "heartbeats": tuple(sink.heartbeats),
        "staging_dir": staging_root(sink.staging_dir or default_staging_dir()),
        "_endpoint": endpoint,
    }
    if sink.duplicate_detection == "none":
        settings["guarantees"] = frozenset({Guarantee.AT_LEAST_ONCE, Guarantee.NONE})
    return settings


def _check_target(sink: SinkSettings) -> None:
    """Where the messages go and what they carry."""
    if sink.destination is None and sink.destination_column is None:
        raise ConfigurationError(
            "StompSink needs a destination or a destination_column",
            fix="StompSink(url, destination='orders') or "
            "StompSink(url, destination_column='queue')",
        )
    if sink.duplicate_detection not in DUPLICATE_DETECTION:
        raise ConfigurationError(
            f"unknown duplicate_detection {sink.duplicate_detection!r}",
            fix="use 'broker' (ActiveMQ Artemis), 'consumer' (every consumer drops "
            "duplicates by the dedup header) or 'none' (at-least-once)",
        )
    check_payload_format("body", sink.body_column, sink.body_format)


def _check_limits(sink: SinkSettings) -> None:
    if not isinstance(sink.id_cache_size, int) or sink.id_cache_size < 1:
        raise ConfigurationError(f"id_cache_size={sink.id_cache_size!r} must be >= 1",
                                 fix="give the broker's id-cache-size (default 20000)")
    if sink.timeout_s <= 0:
        raise ConfigurationError(f"timeout_s={sink.timeout_s!r} must be > 0")


def staging_root(staging: str) -> str:
    """``staging`` as every process reads it the same (``core.storage.registry.resolve_location``):
    a POSIX path made absolute, HDFS through WebHDFS, an S3-compatible store's URI."""
    return resolve_location(os.path.expanduser(staging))


def id_header(duplicate_detection: str, dedup_header: str) -> str:
    """The header that carries each message's duplicate ID."""
    if duplicate_detection == "broker":
        return ARTEMIS_DUPLICATE_HEADER
    return dedup_header


def settings_from_description(description: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor arguments of a sink recorded by ``describe()``; refused when the
    passcode was left out of the record and not given back."""
    settings = dict(description)
    if settings.pop("passcode_omitted", False) and not settings.get("passcode"):
        raise ConfigurationError(
            "the recorded StompSink omits its passcode",
            fix="give it: `sparkeos recover <checkpoint> --set passcode=...`; or "
            "rebuild the sink in your code (with its passcode) and restart the query: "
            "it finishes any pending commits first",
        )
    settings["heartbeats"] = tuple(settings.get("heartbeats", (0, 0)))
    return settings
