"""A query's identity: which commit log, markers and transaction IDs are its own.

The one rule, for every route (foreachBatch classic and under Spark Connect, the
formats' planning, tasks and commit, the start hook): **a query is Spark's query ID**,
the ``id`` Spark keeps in ``<checkpoint>/metadata``, which every run of the query over
that checkpoint reports and no other query has. Each route reads it where it can:

* the running query's local property ``sql.streaming.queryId``: on the driver thread
  that calls ``foreachBatch`` (classic), and in every task of a micro-batch (the
  formats' writers);
* ``<checkpoint>/metadata``, where the route knows the checkpoint (the format's
  ``checkpointLocation`` option, ``exactly_once(..., checkpoint_location=...)``; under
  Spark Connect the only way);
* a ``StreamingQueryListener`` event's ``id`` (the start hook, ``core.streaming.onstart``, which
  acts only on a commit log recorded under that ID).

Where none of these is readable, the query has **no durable identity**, and there is
no fallback name: a key made from the sink's name or a path would be shared by two
queries (a second query, or the same one over a fresh checkpoint, would take the
first one's markers for its own and skip its batches). Then:

* at-least-once writes under a key of this query run only (``QueryIdentity.key``): its
  transaction IDs collide with no other query's, and the replay rule never skips a
  participant (``Transaction.durable_identity``): duplicates are possible, a loss is
  not;
* exactly-once refuses (``require``), with the fix.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from sparkeos.core.errors import CommitLogError, ConfigurationError
from sparkeos.core.snapshot.txpool import TransactionPool, query_key_for

RUNNING_QUERY = "the running query"
TASK = "the task's local property sql.streaming.queryId"


@dataclass(frozen=True)
class QueryIdentity:
    """Spark's query ID (``query_id``; None: no durable identity) and where it was
    read (``found``), or why none could be (``missing``)."""

    query_id: str | None
    found: str
    run_key: str = field(default_factory=lambda: query_key_for(f"run:{uuid.uuid4()}"))
    """The key of a query without a durable identity: this query run's own."""

    @classmethod
    def unknown(cls, why: str) -> QueryIdentity:
        return cls(None, why)

    @property
    def durable(self) -> bool:
        return self.query_id is not None

    @property
    def key(self) -> str:
        """The query key in transaction IDs, marker names and the commit log."""
        return query_key_for(self.query_id) if self.query_id is not None else self.run_key

    def pool(self, sink: str) -> TransactionPool:
        return TransactionPool(self.key, sink, self.durable)

    def require(self, sink: str) -> str:
        """The query ID, for exactly-once: refused without a durable identity."""
        if self.query_id is None:
            raise ConfigurationError(
                f"exactly-once needs the query's identity, and {self.found}",
                sink=sink,
                fix='give the query a checkpointLocation that sparkeos reaches (the '
                'format\'s .option("checkpointLocation", ...), or exactly_once(..., '
                "checkpoint_location=...) under Spark Connect), on which Spark has started "
                "the query; nothing was written")
        return self.query_id

    def agrees_with(self, other: QueryIdentity, sink: str | None = None) -> QueryIdentity:
        """The durable one of the two; refused (fail closed) when both are durable and
        differ: the checkpoint read is not the one the running query uses."""
        if self.query_id is None:
            return other
        if other.query_id is not None and other.query_id != self.query_id:
            raise CommitLogError(
                f"the query is {other.query_id} by {other.found} but {self.query_id} by "
                f"{self.found}: the checkpoint sparkeos reads is not the running query's; "
                "nothing was written",
                sink=sink,
                fix="give sparkeos the query's own checkpointLocation (the same path as "
                "Spark's), one query per checkpoint")
        return self


def of_running_query(query_id: str | None) -> QueryIdentity:
    """From the running query's ID as Spark reports it (classic foreachBatch; None
    under Connect, where no local property reaches the function)."""
    if query_id:
        return QueryIdentity(query_id, RUNNING_QUERY)
    return QueryIdentity.unknown("the foreachBatch function cannot see the running "
                                 "query's ID (Spark Connect)")


def of_checkpoint(location: str | None) -> QueryIdentity:
    """From ``<location>/metadata``, which Spark writes when the query first starts."""
    from .spark import checkpoint_query_id

    if not location:
        return QueryIdentity.unknown("no checkpointLocation reaches sparkeos")
    query_id = checkpoint_query_id(location)
    if query_id is None:
        return QueryIdentity.unknown(
            f"the checkpoint {location} has no readable query metadata "
            "(<checkpoint>/metadata, which Spark writes when the query starts)")
    return QueryIdentity(query_id, f"{location.rstrip('/')}/metadata")


def of_task(query_id: str | None) -> QueryIdentity:
    """From the local property Spark sets on every task of a micro-batch."""
    if query_id:
        return QueryIdentity(query_id, TASK)
    return QueryIdentity.unknown("the task runs outside a streaming query")


_CHECKPOINT_IDS: dict[str, QueryIdentity] = {}
"""The checkpoint identities a task process read already (real-time mode opens a
transaction per partition and epoch: the metadata is read once per process)."""


def of_real_time_task(task_query_id: str | None, checkpoint_location: str | None,
                      sink: str) -> QueryIdentity:
    """The real-time writer's route: the task's local property, checked against the
    metadata of the checkpoint the writer was given (when it was given one)."""
    task = of_task(task_query_id)
    if not checkpoint_location:
        return task
    given = _CHECKPOINT_IDS.get(checkpoint_location)
    if (given is None or not given.durable
            or (task.durable and given.query_id != task.query_id)):
        # Read again where the cache disagrees: a checkpoint replaced at the same path
        # by a query of this same application.
        given = _CHECKPOINT_IDS[checkpoint_location] = of_checkpoint(checkpoint_location)
    return given.agrees_with(task, sink)


def of_foreach_batch(running_query_id: str | None, checkpoint_location: str | None
                     ) -> QueryIdentity:
    """The foreachBatch route: the running query's ID (classic), else the metadata of
    the checkpoint the adapter was given (Connect)."""
    running = of_running_query(running_query_id)
    if running.durable:
        return running
    given = of_checkpoint(checkpoint_location)
    if given.durable:
        return given
    return QueryIdentity.unknown(
        "the foreachBatch function cannot see the running query's ID (Spark Connect) "
        + ("and " + given.found if checkpoint_location else
           "and was given no checkpoint_location"))


__all__ = ["QueryIdentity", "of_checkpoint", "of_foreach_batch", "of_real_time_task",
           "of_running_query", "of_task"]
