"""Phase 2 of staged mode: publish a decided attempt's staged records to Kafka.

In a Spark task or the format's commit worker, after ``decided(N)``: a producer of
the participant's transactional ID (this process's from an earlier batch, else a fresh
one whose ``init_transactions`` fences every earlier one: ``clients``); the marker says
whether batch N is committed already with these rows (then nothing is sent: commit is
idempotent; a commit of other rows, by an at-least-once run before the query moved to
exactly-once, is reported and does not count); else one Kafka transaction carries every
staged record, the progress record and the marker (under at-least-once, a first
progress record too: ``pool``). The ``commit_step`` calls are where the conformance
suite pauses one of two concurrent committers. Transient failures (leader moves, broker
restarts, abortable errors) start over with a fresh producer, a few times within the
transaction timeout.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import SparkEOSError
from sparkeos.core.protocol import Receipt, Transaction
from sparkeos.core.snapshot.fingerprint import Written
from sparkeos.core.snapshot.replay import committed_before
from sparkeos.core.steps import commit_step

from . import clients, markers, producers, staged
from .config import KafkaConfig
from .errors import (
    PHASE2,
    failed,
    is_fenced,
    is_permanent,
    is_retriable,
    requires_abort,
    underlying,
)

_ATTEMPTS = 4
KEPT_MARKER_READ_S = 3.0


def commit_staged(config: KafkaConfig, txn: Transaction, receipt: Receipt, *,
                  recovering: bool) -> None:
    """Publish the receipt's staged file once (retrying transient failures), then
    delete what the attempt staged."""
    commit_unit(config, [(txn, receipt)], recovering=recovering)


def commit_unit(config: KafkaConfig, unit: Sequence[tuple[Transaction, Receipt]], *,
                recovering: bool) -> None:
    """Publish the staged files of one commit unit (one participant, or one committer's
    participants: ``core.snapshot.committers``) in one Kafka transaction under the first
    participant's transactional ID, retrying transient failures; then delete what they
    staged."""
    first = unit[0][0]
    deadline = time.monotonic() + max(config.timeout_s, config.transaction_timeout_ms / 1000)
    attempt = 0
    while True:
        attempt += 1
        try:
            publish(config, unit, recovering)
            break
        except SparkEOSError:
            raise
        except Exception as exc:
            # Leader moves, broker restarts, an abortable error: start over with a
            # fresh producer (its init_transactions aborts what is left open). A
            # refused record fails every try alike, and a later try's different
            # failure (a marker read timing out) would hide its cause.
            transient = not is_permanent(exc) and (
                is_retriable(exc) or requires_abort(exc) or is_fenced(exc))
            if transient and attempt < _ATTEMPTS and time.monotonic() < deadline:
                time.sleep(0.2 * attempt)
                continue
            raise failed(config, exc, first, PHASE2, "commit") from None
    staging = staged.staging_area(config)
    for txn, _receipt in unit:
        staging.delete(txn)


def publish(config: KafkaConfig, unit: Sequence[tuple[Transaction, Receipt]],
            recovering: bool) -> None:
    """One try: fence, check the markers, produce the staged records and commit them
    with the markers in one Kafka transaction. A producer kept from an earlier batch
    that fails in any way (most likely fenced by a producer of its ID that started
    since, or its marker read held by what a dead one left open: ``clients``) is
    replaced at once by a fresh one, whose ``init_transactions`` fences in its turn."""
    first = unit[0][0]
    producer, kept = producers.phase2_producer(config, first, PHASE2)
    try:
        _publish_with(config, producer, unit, recovering, kept)
        return
    except Exception as exc:
        if not kept or is_permanent(exc):
            raise
    _publish_with(config, producers.init_producer(config, first, PHASE2), unit, recovering,
                  False)


def _publish_with(config: KafkaConfig, producer: Any,
                  unit: Sequence[tuple[Transaction, Receipt]], recovering: bool,
                  kept: bool) -> None:
    """Publish with ``producer``, kept for the next batch if its transaction ended
    cleanly, else aborted and closed."""
    try:
        clean = _publish(config, producer, unit, recovering, kept)
    except BaseException as exc:
        original = underlying(producer, exc)
        producers.abort_quietly(producer, config.timeout_s)
        clients.close_quietly(producer)
        if original is exc:
            raise
        raise original from None
    if clean and not producers.in_spark_task():
        # A Spark task's next commit of this ID lands in any Python worker: a producer
        # kept here would mostly be fenced by another worker's before its reuse.
        clients.keep_producer(config.producer_settings(config.transactional_id(unit[0][0])),
                              producer)
    else:
        clients.close_quietly(producer)


def _publish(config: KafkaConfig, producer: Any, unit: Sequence[tuple[Transaction, Receipt]],
             recovering: bool, kept: bool) -> bool:
    """True if the producer's transaction ended cleanly (committed, or none begun).
    The steps are the first participant's: its transactional ID is the unit's."""
    first = unit[0][0]
    commit_step("initialised", first)
    # A kept producer reads the markers briefly: pending offsets a dead twin of its ID
    # left would hold the read for timeout_s, where a fresh producer's
    # init_transactions aborts them at once (the retry above).
    timeout_s = min(config.timeout_s, KEPT_MARKER_READ_S) if kept else None
    pending: list[tuple[Transaction, Receipt, Written | None]] = []
    for txn, receipt in unit:
        written = Written.from_json(receipt.get("written"))
        marker = markers.committed_marker(config, txn, PHASE2, recovering, timeout_s=timeout_s)
        if not committed_before(txn, written, marker.on_record()):
            pending.append((txn, receipt, written))
    if not pending:
        return True  # committed before (an earlier attempt or run): idempotent
    commit_step("checked", first)
    paths = [(txn, receipt, written, staged.staged_path(config, txn, receipt))
             for txn, receipt, written in pending]
    todo = [(txn, receipt, written, path) for txn, receipt, written, path in paths
            if path is not None]
    if not todo:
        return True
    producer.begin_transaction()
    if config.announces_open:
        markers.announce_open(config, producer, first)
    for txn, receipt, _written, path in todo:
        if not _produce_staged(config, producer, txn, receipt, path):
            return False
    commit_step("produced", first)
    markers.commit_with_markers(config, producer,
                                [(txn, written) for txn, _r, written, _p in todo])
    commit_step("committed", first)
    return True


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
