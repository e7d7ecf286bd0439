"""Several sinks under one decision: Jet's snapshot covers every sink of a job at once.

``exactly_once({"db": pg_sink, "events": (kafka_sink, to_events)}, name="orders")``
gives the query one commit log and one transaction pool for all its members. Every
participant of every member prepares; one ``decided(N)`` names them all; then each
member commits its own, and recovery finishes or rolls back all members together. So
after any crash, batch N is either in every member's destination or in none of them
(before phase 2 ends, it may be visible in one and on its way to the other, as a
batch is partition by partition within one sink).

Participants are numbered across the group: member ``m``'s partition ``i`` is the
group's partition ``offset(m) + i``, so every attempt ID of the group is distinct and
one attempt range covers them all. ``begun`` records each member's ``[offset,
count]``; each decided participant names its member.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkeos.core.config import validate_sink_name
from sparkeos.core.errors import ConfigurationError
from sparkeos.core.protocol import JsonDict, TransactionalSink, TxnState

SINGLE = ""
"""The member name of a coordinator's only sink (its log records name no member)."""


SINK_GROUP_TYPE = "sparkeos.core.group.SinkGroup"
"""How commit logs name a sink group (``sink.json``'s ``sink_type``, compared on every
restart): the class's path when the first logs were written. A recorded name is data,
so it stays when the class moves (it is ``core.snapshot.group`` now)."""


@dataclass(frozen=True)
class SinkGroup:
    """The members of one decision, by name (names are recorded: keep them stable)."""

    members: Mapping[str, TransactionalSink[Any]]

    def __post_init__(self) -> None:
        members = dict(self.members)
        if not members:
            raise ConfigurationError("a sink group needs at least one member",
                                     fix='exactly_once({"db": sink_a, "events": sink_b}, ...)')
        for name, sink in members.items():
            validate_sink_name(name)
            if not isinstance(sink, TransactionalSink):
                raise ConfigurationError(
                    f"member {name!r} is a {type(sink).__name__}, not a sparkeos sink",
                    fix="give each member a sink (a TransactionalSink), or a pair (sink, "
                    "function from the batch DataFrame to the member's DataFrame)")
        object.__setattr__(self, "members", members)

    @property
    def type_name(self) -> str:
        if type(self) is SinkGroup:
            return SINK_GROUP_TYPE
        return f"{type(self).__module__}.{type(self).__qualname__}"

    def identity(self) -> JsonDict:
        return {name: sink.identity() for name, sink in self.members.items()}

    def describe(self) -> JsonDict:
        return {name: {"type": sink.type_name, "description": sink.describe()}
                for name, sink in self.members.items()}

    @classmethod
    def from_description(cls, description: Mapping[str, Any]) -> SinkGroup:
        """Rebuild from ``describe()``; ``member.key=value`` entries (``sparkeos recover
        --set db.dsn=...``) override one member's settings, plain ``key=value`` every
        member that has the setting (a field of its class, recorded or secret)."""
        members: dict[str, TransactionalSink[Any]] = {}
        plain = {k: v for k, v in description.items() if not isinstance(v, Mapping)}
        shared = {k: v for k, v in plain.items() if "." not in k}
        taken: set[str] = set()
        for name, entry in description.items():
            if not isinstance(entry, Mapping):
                continue
            own = {k.split(".", 1)[1]: v for k, v in plain.items()
                   if k.startswith(f"{name}.")}
            recorded = dict(entry.get("description", {}))
            settings_of = _settings_of(str(entry["type"]), recorded)
            mine = {k: v for k, v in shared.items() if k in settings_of}
            taken.update(mine)
            members[name] = load_sink(str(entry["type"]), {**recorded, **mine, **own})
        unused = sorted(set(shared) - taken)
        if unused:
            raise ConfigurationError(
                f"no member of the sink group has the setting(s) {', '.join(unused)}",
                fix="check the name, or set it on one member: --set MEMBER.KEY=VALUE")
        return cls(members)

    def probe(self, txn: Any) -> TxnState:
        """What the members' destinations hold for ``txn`` (an ID lives in one)."""
        seen = [sink.probe(txn) for sink in self.members.values()]
        for state in (TxnState.PREPARED, TxnState.OPEN, TxnState.COMMITTED):
            if state in seen:
                return state
        return TxnState.UNKNOWN if TxnState.UNKNOWN in seen else TxnState.ABSENT

    def close(self) -> None:
        for sink in self.members.values():
            sink.close()


def for_checkpoint(sink: TransactionalSink[Any] | SinkGroup, location: str,
                   sink_name: str) -> TransactionalSink[Any] | SinkGroup:
    """``sink`` (every member of a group) bound to the query's checkpoint
    (``TransactionalSink.for_checkpoint``); a member is named ``<sink name>-<member>``."""
    if isinstance(sink, SinkGroup):
        return SinkGroup({name: member.for_checkpoint(location, f"{sink_name}-{name}")
                          for name, member in sink.members.items()})
    return sink.for_checkpoint(location, sink_name)


def members_of(sink: TransactionalSink[Any] | SinkGroup) -> dict[str, TransactionalSink[Any]]:
    """A coordinator's members: a group's, or a single sink under the name ``SINGLE``."""
    if isinstance(sink, SinkGroup):
        return dict(sink.members)
    return {SINGLE: sink}


def _load_class(type_name: str) -> Any:
    if type_name == SINK_GROUP_TYPE:
        return SinkGroup
    module, _, qualname = type_name.rpartition(".")
    cls: Any = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    return cls


def _settings_of(type_name: str, recorded: Mapping[str, Any]) -> set[str]:
    """The settings a sink class takes: its dataclass fields (secret ones included,
    which are never recorded), else what its description recorded."""
    cls = _load_class(type_name)
    names = set(recorded)
    if dataclasses.is_dataclass(cls):
        names.update(f.name for f in dataclasses.fields(cls))
    return names


def load_recorded_sink(meta: Mapping[str, Any], overrides: Mapping[str, str]) -> Any:
    """The sink (or sink group) a commit log's ``sink.json`` describes, with the
    ``--set`` overrides (secrets are never recorded)."""
    return load_sink(str(meta["sink_type"]), {**meta.get("description", {}), **overrides})


def load_sink(type_name: str, description: Mapping[str, Any]) -> Any:
    """A sink (or group) rebuilt from its recorded type name and description."""
    cls = _load_class(type_name)
    try:
        return cls.from_description(dict(description))
    except TypeError as exc:
        raise ConfigurationError(
            f"cannot rebuild {type_name} from its recorded description ({exc})",
            fix="pass the missing settings (secrets are never recorded) with --set KEY=VALUE "
            "(a member of a group: --set MEMBER.KEY=VALUE)",
        ) from None
