"""StompSink's error translation: what a commit's publish raises (the broker's refusal,
a dropped connection, a vanished staged file) as the sparkeos error that says whether
to retry, reconfigure or restore.

A decided batch is never given up: a refusal or an outage leaves it to a restart; only
a staged file gone without a PUBLISHED record is data loss.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkeos.core.errors import (
    ConfigurationError,
    DataLossError,
    RetriableError,
    SparkEOSError,
)
from sparkeos.core.protocol import Transaction

from .client import BrokerRejected, ConnectionLost


def lost(txn: Transaction, problem: str) -> DataLossError:
    return DataLossError(
        f"{problem} and no PUBLISHED record says it was sent",
        sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
        fix="something deleted the staging directory: restore it from a backup, or "
        "re-process this batch from the source",
    )


def publish_translated(txn: Transaction, address: str, publish: Callable[[], None],
                       published: Callable[[], bool]) -> bool:
    """Run ``publish``; False if it failed because a concurrent attempt of this commit
    published the batch (``published()`` says so), else its failure as a sparkeos
    error."""
    try:
        publish()
    except (DataLossError, FileNotFoundError) as exc:
        # A concurrent attempt of this commit may have published and deleted the
        # staged file between our checks: its PUBLISHED record says so.
        if published():
            return False
        if isinstance(exc, DataLossError):
            raise
        raise lost(txn, "the staged file vanished while it was read") from None
    except SparkEOSError:
        raise
    except BrokerRejected as exc:
        raise ConfigurationError(
            f"the broker refused the publish of participant {txn.participant_id}: "
            f"{exc} {exc.body}".strip()[:500],
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="check the destination and the user's send permission on the broker; "
            "the batch is decided, so a restart publishes it then",
        ) from None
    except (ConnectionLost, TimeoutError, OSError) as exc:
        raise RetriableError(
            f"publishing participant {txn.participant_id} to {address} failed: {exc}",
            sink=txn.sink, batch_id=txn.batch_id, txn_id=txn.txn_id,
            fix="the batch is decided: it is published when the broker is back (Spark "
            "retries the task; else restart the query); the broker drops what a "
            "re-publish repeats",
        ) from None
    return True
