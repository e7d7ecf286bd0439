"""Test tools for connector authors: the streaming job runner and the conformance suite.

``sparkeos.testing.conformance.ConnectorConformance`` is the restart test every
connector runs: subclass it, say how to build your sink and how to read back what
is visible, and pytest runs the crash-point matrix against real Spark.
"""

from __future__ import annotations

from sparkeos.core.snapshot.txpool import Transaction, TransactionPool


def transaction(batch_id: int = 0, partition: int = 0, tag: int = 0, run: int = 0,
                sink: str = "test", query_key: str = "testquery") -> Transaction:
    """A ``Transaction`` as the coordinator hands one to a task attempt (unit tests)."""
    return TransactionPool(query_key, sink).transaction(batch_id, partition, run, tag)


__all__ = ["transaction"]
