"""What the real-time writer refuses before an epoch's first rows: an attempt a later one
of the same query run superseded, and output another query (a lost checkpoint)
committed under the same sink name. Each refusal writes nothing."""

from __future__ import annotations

import logging
from typing import Any

from sparkeos.core.errors import AttemptFencedError, ConfigurationError
from sparkeos.core.observe import log_event
from sparkeos.core.protocol import EpochParticipant, Transaction
from sparkeos.core.snapshot.positions import AttemptOf, Mark, superseded

_NO_OTHER_OUTPUT: set[tuple[str, str, str]] = set()
"""(query key, sink, destination) this process found no other query's output for:
asked once."""


def peek(participant: EpochParticipant[Any], name: str, txn: Transaction) -> Mark | None:
    """The mark before the fence, best effort: it only spares the attempt Spark counts a
    fence; the mark read after the fence decides."""
    try:
        recorded = participant.peek_mark(txn)
        return Mark.from_json(recorded) if recorded is not None else None
    except Exception as exc:
        log_event("realtime.peek_failed", logging.INFO, sink=name, batch=txn.batch_id,
                  partition=txn.partition, cause=repr(exc)[:200])
        return None


def refuse_superseded(name: str, mark: Mark | None, txn: Transaction,
                      this: AttemptOf | None) -> None:
    """An attempt whose (partition, epoch) a later attempt of the same query run has
    committed is one Spark no longer counts (``positions.superseded``)."""
    if superseded(mark, txn.batch_id, this):
        raise AttemptFencedError(
            f"epoch {txn.batch_id} of partition {txn.partition} was committed by a later "
            f"attempt of this query run ({mark.by if mark else None}): this attempt "
            f"({this}) is one Spark no longer counts, and writes nothing",
            sink=name, batch_id=txn.batch_id,
            fix="nothing to do: the attempt Spark counts has committed the epoch")


def refuse_existing_output(participant: EpochParticipant[Any], name: str, destination: str,
                           query_key: str, txn: Transaction) -> None:
    """A partition with no mark of this query: before its first rows, refuse to write
    again what another query (a lost checkpoint) committed under this name."""
    checked = (query_key, name, destination)
    if checked in _NO_OTHER_OUTPUT:
        return
    found = participant.output_of_other_queries(query_key, name)
    if found:
        raise ConfigurationError(
            f"the destination already holds committed output of sink name {name!r} "
            f"written by another query ({found}), and this query has committed nothing "
            f"to partition {txn.partition} yet (a lost or different checkpoint): writing "
            "would put those rows there twice",
            sink=name, batch_id=txn.batch_id,
            fix="restore the checkpoint the output was written with; or start this query "
            "where the old one stopped (a later startingOffsets) and pass "
            "exactly_once_writer(..., existing_output='accept'); or use another sink name "
            "or destination. Nothing was written")
    _NO_OTHER_OUTPUT.add(checked)


__all__ = ["peek", "refuse_existing_output", "refuse_superseded"]
