"""Phase 2 of staged mode: publish a decided attempt's staged records to Kafka.

In a Spark task, after ``decided(N)``: a fresh producer of the participant's
transactional ID fences every earlier one; the marker says whether batch N is
committed already with these rows (then nothing is sent: commit is idempotent; a
commit of other rows, by an at-least-once run before the query moved to exactly-once,
is reported and does not count); else one Kafka transaction carries every staged
record, the progress record and the marker (under at-least-once, a first progress
record too: ``pool``). The
``commit_step`` calls are where the conformance suite pauses one of two concurrent
committers. Transient failures (leader moves, broker restarts, abortable errors) start
over with a fresh producer, a few times within the transaction timeout.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import SparkEOSError
from sparkeos.core.protocol import Receipt, Transaction
from sparkeos.core.snapshot.fingerprint import Written
from sparkeos.core.snapshot.replay import committed_before
from sparkeos.core.steps import commit_step

from . import clients, markers, producers, staged
from .config import KafkaConfig
from .errors import PHASE2, failed, is_fenced, is_retriable, requires_abort, underlying

_ATTEMPTS = 4


def commit_staged(config: KafkaConfig, txn: Transaction, receipt: Receipt, *,
                  recovering: bool) -> None:
    """Publish the receipt's staged file once (retrying transient failures), then
    delete what the attempt staged."""
    deadline = time.monotonic() + max(config.timeout_s, config.transaction_timeout_ms / 1000)
    attempt = 0
    while True:
        attempt += 1
        try:
            publish(config, txn, receipt, recovering)
            break
        except SparkEOSError:
            raise
        except Exception as exc:
            # Leader moves, broker restarts, an abortable error: start over with a
            # fresh producer (its init_transactions aborts what is left open).
            transient = is_retriable(exc) or requires_abort(exc) or is_fenced(exc)
            if transient and attempt < _ATTEMPTS and time.monotonic() < deadline:
                time.sleep(0.2 * attempt)
                continue
            raise failed(config, exc, txn, PHASE2, "commit") from None
    staged.staging_area(config).delete(txn)


def publish(config: KafkaConfig, txn: Transaction, receipt: Receipt, recovering: bool) -> None:
    """One try: fence, check the marker, produce the staged records and commit them
    with the marker in one Kafka transaction."""
    producer = producers.init_producer(config, txn, PHASE2)
    try:
        commit_step("initialised", txn)
        written = Written.from_json(receipt.get("written"))
        marker = markers.committed_marker(config, txn, PHASE2, recovering)
        if committed_before(txn, written, marker.on_record()):
            return  # committed before (an earlier attempt or run): idempotent
        commit_step("checked", txn)
        path = staged.staged_path(config, txn, receipt)
        if path is None:
            return
        producer.begin_transaction()
        if config.announces_open:
            markers.announce_open(config, producer, txn)
        if not _produce_staged(config, producer, txn, receipt, path):
            return
        commit_step("produced", txn)
        markers.commit_with_marker(config, producer, txn, written)
        commit_step("committed", txn)
    except BaseException as exc:
        original = underlying(producer, exc)
        producers.abort_quietly(producer, config.timeout_s)
        if original is exc:
            raise
        raise original from None
    finally:
        clients.close_quietly(producer)


def _produce_staged(config: KafkaConfig, producer: Any, txn: Transaction, receipt: Receipt,
                    path: str) -> bool:
    """Produce every record of the staged file; False if a twin committed it and
    deleted the file meanwhile (the transaction is then aborted)."""
    try:
        with staged.staging_area(config).open_staged(path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                producers.produce(config, producer, reader.get_batch(i))
    except FileNotFoundError:
        # Deleted while read (HDFS): by a twin that committed, or lost.
        if staged.staged_path(config, txn, receipt) is None:
            producers.abort_quietly(producer, config.timeout_s)
            return False
        raise
    return True
