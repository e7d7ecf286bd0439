"""Which participants of a decided batch commit together (``merges_commits``).

A sink whose destination can make the receipts of several participants visible in one
transaction (Kafka: a transaction spans topic partitions) commits a batch in at most
``commit_parallelism`` transactions, however many Spark partitions wrote it: the format
route makes one participant per Spark partition, and each transaction has a fixed cost
(its commit, the marker, a transactional producer of its own ID).

The grouping is part of the decision. ``assign`` writes each participant's
``committer`` into the decided record, and every commit of the batch (phase 2, recovery
in any process, ``sparkeos recover``) commits each committer's participants together
(``units``), under the first one's transaction. It is recorded, not worked out again at
commit time: two committers of one participant grouped otherwise would commit under two
transactional IDs, and the fencing of one would not reach the other (a duplicate).

A decision without ``committer`` (a sink that does not merge, few enough participants,
phase 2 spread over Spark tasks, or a record written before merging existed) commits
every participant alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.protocol import Receipt, TransactionalSink

from .txpool import Transaction

COMMITTER = "committer"
"""The key of a decided participant that names its committer (0 .. committers - 1)."""

Unit = list[tuple[Transaction, Receipt]]
"""The participants one commit makes visible together, the lowest partition first."""


def assign(participants: Sequence[dict[str, Any]],
           members: Mapping[str, TransactionalSink[Any]], committers: int,
           member_of: Callable[[dict[str, Any]], str],
           in_one_process: Callable[[str], bool]) -> None:
    """Name a committer in each participant of a member whose sink ``merges_commits``
    and whose phase 2 runs ``in_one_process`` (merging where Spark tasks spread the
    commits would take their parallelism away), as the sink's ``commit_groups`` says.
    Other participants, and a member whose groups are all of one, are left as they are
    (each commits alone)."""
    by_member: dict[str, list[dict[str, Any]]] = {}
    for participant in participants:
        by_member.setdefault(member_of(participant), []).append(participant)
    for member, own in by_member.items():
        sink = members[member]
        if len(own) < 2 or not sink.merges_commits() or not in_one_process(member):
            continue
        ordered = sorted(own, key=lambda p: int(p["partition"]))
        groups = sink.commit_groups([p["receipt"] for p in ordered], committers)
        if len(groups) != len(ordered) or any(
                not isinstance(g, int) or isinstance(g, bool) or g < 0 for g in groups):
            raise ConfigurationError(
                f"{type(sink).__name__}.commit_groups gave {groups!r} for "
                f"{len(ordered)} receipts: it must give one committer number (>= 0) per "
                "receipt; the batch was not decided", sink=member,
                fix="fix the sink's commit_groups; restart the query (the batch is "
                "written again)")
        if len(set(groups)) == len(groups):
            continue
        for participant, committer in zip(ordered, groups, strict=True):
            participant[COMMITTER] = committer


def units(items: Sequence[tuple[Transaction, Receipt, int | None]]) -> list[Unit]:
    """One member's decided participants as commit units: those of one committer
    together, each other one alone, in the order of their first partitions."""
    grouped: dict[int, Unit] = {}
    alone: list[Unit] = []
    for txn, receipt, committer in sorted(items, key=lambda item: item[0].partition):
        if committer is None:
            alone.append([(txn, receipt)])
        else:
            grouped.setdefault(committer, []).append((txn, receipt))
    return sorted([*grouped.values(), *alone], key=lambda unit: unit[0][0].partition)


def committer_of(participant: dict[str, Any]) -> int | None:
    """The committer a decided participant names, or None (it commits alone)."""
    value = participant.get(COMMITTER)
    return None if value is None else int(value)
