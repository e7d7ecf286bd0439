"""KafkaSink in Spark's real-time mode: one Kafka transaction per (partition, epoch).

``peek_mark`` reads the partition's marker without a producer (fencing no one).
``open_epoch`` makes a producer with the participant's pooled ``transactional.id`` (the
epoch's slot: every attempt of an epoch shares it) and runs ``init_transactions``,
which fences every older attempt of the epoch and aborts what it left open; it reads the
partition's marker and begins the transaction. ``write_epoch`` produces records as the
epoch's rows arrive; ``commit_epoch`` adds the marker, whose metadata carries the
partition's mark (``core.snapshot.positions``), and the progress record, and commits:
the records and the mark become visible together. The marker is the one
``markers`` keeps for every participant (offset ``epoch + 1``); where the broker expired
it, the progress record (a compacted topic) still holds the mark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkeos.core.protocol import EpochParticipant, JsonDict, Transaction

from . import clients, direct, markers, preflight, producers
from .config import KafkaConfig
from .errors import PHASE1, failed, underlying

PEEK_TIMEOUT_S = 2.0
MARK_KEY = "mark"
"""The field of a marker's metadata (and progress record) that holds the mark."""


@dataclass
class EpochHandle:
    txn: Transaction
    producer: Any
    mark: JsonDict | None
    topics: set[str] = field(default_factory=set)


class KafkaEpochs(EpochParticipant[EpochHandle]):
    """The epoch participant of a ``KafkaSink`` (``KafkaSink.epoch_participant``)."""

    def __init__(self, sink: KafkaConfig) -> None:
        self.sink = sink
        self._checked = False

    def epoch_rows(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The serialised records (key and value as bytes): what a row is, whatever
        types the rows of one write were given (a column of nulls only has none)."""
        columns = [column.cast(pa.binary()) if pa.types.is_null(column.type) else column
                   for column in batch.columns]
        batch = pa.RecordBatch.from_arrays(columns, names=batch.schema.names)
        layout = self.sink.layout()
        if not self._checked:
            layout.check_schema(batch.schema)
            self._checked = True
        return layout.serialize(batch)

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        return markers.output_of_other_queries(self.sink, query_key, sink)

    def peek_mark(self, txn: Transaction) -> JsonDict | None:
        # Short, and without the progress records: a peek only spares a fence; the read
        # after the fence decides (a commit a dead attempt left pending makes the
        # committed offset wait until the fence ends it).
        return _mark_of(markers.committed_record(self.sink, txn, PHASE1,
                                                 timeout_s=PEEK_TIMEOUT_S))

    def fence_epoch(self, txn: Transaction) -> None:
        producer = producers.init_producer(self.sink, txn, PHASE1)
        clients.close_quietly(producer)

    def open_epoch(self, txn: Transaction) -> EpochHandle:
        sink = self.sink
        producer = producers.init_producer(sink, txn, PHASE1)
        try:
            recorded = markers.committed_record(sink, txn, PHASE1, recovering=True)
            producer.begin_transaction()
        except BaseException as exc:
            exc = underlying(producer, exc)
            producers.abort_quietly(producer, sink.timeout_s)
            clients.close_quietly(producer)
            raise failed(sink, exc, txn, PHASE1, "begin transaction") from None
        return EpochHandle(txn, producer, _mark_of(recorded))

    def epoch_mark(self, handle: EpochHandle) -> JsonDict | None:
        return handle.mark

    def write_epoch(self, handle: EpochHandle, rows: pa.RecordBatch) -> None:
        topics = preflight.row_topics(rows) - handle.topics
        if topics:
            preflight.require_topics(self.sink, sorted(topics), handle.txn)
            handle.topics |= topics
        try:
            producers.produce(self.sink, handle.producer, rows)
        except BaseException as exc:
            raise failed(self.sink, underlying(handle.producer, exc), handle.txn, PHASE1,
                         "produce") from None

    def commit_epoch(self, handle: EpochHandle, mark: JsonDict) -> None:
        direct.commit(self.sink, handle.producer, handle.txn, None, {MARK_KEY: mark})

    def abort_epoch(self, handle: EpochHandle) -> None:
        direct.abort(self.sink, handle.producer)


def _mark_of(recorded: dict[str, Any] | None) -> JsonDict | None:
    mark = recorded.get(MARK_KEY) if recorded else None
    return mark if isinstance(mark, dict) else None


__all__ = ["MARK_KEY", "EpochHandle", "KafkaEpochs"]
