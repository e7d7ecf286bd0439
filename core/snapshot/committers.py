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
or a record written before merging existed) commits every participant alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sparkeos.core.protocol import Receipt

from .txpool import Transaction

COMMITTER = "committer"
"""The key of a decided participant that names its committer (0 .. committers - 1)."""

Unit = list[tuple[Transaction, Receipt]]
"""The participants one commit makes visible together, the lowest partition first."""


def assign(participants: Sequence[dict[str, Any]], merges: Callable[[str], bool],
           committers: int, member_of: Callable[[dict[str, Any]], str]) -> None:
    """Name a committer in each participant of a member whose sink ``merges`` and that
    has more than ``committers`` participants: contiguous runs of partitions, as even
    as they divide. Other participants are left as they are (each commits alone)."""
    by_member: dict[str, list[dict[str, Any]]] = {}
    for participant in participants:
        by_member.setdefault(member_of(participant), []).append(participant)
    for member, own in by_member.items():
        if len(own) <= committers or not merges(member):
            continue
        ordered = sorted(own, key=lambda p: int(p["partition"]))
        for rank, participant in enumerate(ordered):
            participant[COMMITTER] = rank * committers // len(ordered)


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
