"""Spark's real-time mode through a ForeachWriter: ``exactly_once_writer(sink, name=...)``.

``df.writeStream.foreach(exactly_once_writer(KafkaSink(...), name="events",
checkpoint_location=...)).outputMode("update").trigger(realTime="5 seconds")``: Spark
calls ``open(partition, epoch)``, ``process(row)`` for each row as it arrives, and
``close(error)``, in a task per partition and epoch. Each of those is one transaction of
the sink's epoch participant (``core.protocol.EpochParticipant``), committed in
``close`` with the partition's mark; ``core.snapshot.positions`` decides which rows a
replay writes. No driver takes part, so a row becomes visible when its epoch's task
closes: the epoch is the latency a ``read_committed`` reader sees. The same writer works
under micro-batch triggers, where an epoch is a batch.

Rows reach the sink in Arrow batches of ``rows_per_write`` rows (the destination
receives them while the epoch runs, and they stay invisible until its commit).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
import uuid
from typing import Any

import pyarrow as pa

from sparkeos.core.config import Guarantee, validate_existing_output, validate_sink_name
from sparkeos.core.errors import AttemptFencedError, ConfigurationError
from sparkeos.core.faults import FaultPlan
from sparkeos.core.observe import log_event
from sparkeos.core.protocol import EpochParticipant, Transaction, TransactionalSink
from sparkeos.core.snapshot.positions import AttemptOf, EpochPositions, Mark
from sparkeos.core.snapshot.txpool import query_key_for

from . import epochchecks, epochrecord, identity
from .epochopen import Opening
from .workerpath import steady_spark_archives

ROWS_PER_WRITE = 1000
OPEN_AHEAD = True
"""``open`` returns at once; the epoch's transaction opens ahead of its rows
(``epochopen``)."""
_REAL_TIME_GUARANTEES = (Guarantee.EXACTLY_ONCE, Guarantee.AT_LEAST_ONCE)


class EpochWriter:
    """The object ``df.writeStream.foreach`` takes. Built on the driver (the sink's
    participant is checked there); pickled to every task, where each ``open`` starts
    one (partition, epoch) attempt."""

    def __init__(self, sink: TransactionalSink[Any], name: str, guarantee: Guarantee,
                 checkpoint_location: str | None, rows_per_write: int,
                 existing_output: str = "refuse") -> None:
        self.name = validate_sink_name(name)
        if not isinstance(sink, TransactionalSink):
            raise ConfigurationError(
                f"the real-time writer takes one sink, not a {type(sink).__name__}: the "
                "members of a sink group commit under one decision per batch, and in "
                "real-time mode no driver decides an epoch", sink=name,
                fix="write the group with a micro-batch trigger and "
                "foreachBatch(exactly_once(group)), or give each sink a writer (and a "
                "query) of its own")
        if guarantee not in _REAL_TIME_GUARANTEES:
            raise ConfigurationError(
                f"real-time mode writes exactly_once or at_least_once, not {guarantee.value}",
                sink=name, fix="use exactly_once_writer or at_least_once_writer")
        if guarantee not in sink.guarantees:
            raise ConfigurationError(
                f"{type(sink).__name__} does not offer {guarantee.value}", sink=name,
                fix="pick a guarantee the sink offers")
        self.existing_output = validate_existing_output(existing_output, name)
        if rows_per_write < 1:
            raise ConfigurationError(f"rows_per_write must be at least 1, not "
                                     f"{rows_per_write}", sink=name, fix="leave the default")
        if guarantee is Guarantee.EXACTLY_ONCE:
            _refuse_speculation(name)
            if not checkpoint_location:
                raise ConfigurationError(
                    "exactly_once_writer needs the query's checkpoint_location: the tasks "
                    "read there which epochs Spark has recorded, so an attempt of one of "
                    "them that comes late (a zombie) cannot commit", sink=name,
                    fix="pass checkpoint_location=<the query's checkpointLocation>, on a "
                    "file system every executor reaches")
        self.participant: EpochParticipant[Any] = sink.epoch_participant()
        self.destination = json.dumps(sink.identity(), sort_keys=True, default=str)
        if checkpoint_location:
            _record_writer(checkpoint_location, self.name, sink)
        self.guarantee = guarantee
        self.checkpoint_location = checkpoint_location
        self.run_key = query_key_for(f"run:{uuid.uuid4()}")
        """A query without a durable identity writes under this key (at-least-once):
        one per writer, not one per task."""
        self.rows_per_write = rows_per_write
        self.faults = FaultPlan.from_env()
        self.open_ahead = OPEN_AHEAD
        self.last_epoch: dict[str, Any] = {}
        """What this task's last committed (partition, epoch) cost: ``rows`` written,
        ``skipped`` (a replay's rows committed before), ``open_ms`` (peek, fence and mark;
        ahead of the rows), ``commit_ms``, ``ms`` (open to committed)."""
        self._open_ms = 0.0
        self._reset()

    def _reset(self) -> None:
        self._opening: Opening[tuple[Any, EpochPositions]] | None = None
        self._handle: Any = None
        self._positions: EpochPositions | None = None
        self._rows: list[Any] = []
        self._fields: list[str] | None = None
        self._written = 0
        self._started = 0.0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_opening=None, _handle=None, _positions=None, _rows=[], _fields=None)
        return state

    # -- ForeachWriter -----------------------------------------------------------------------
    def open(self, partition_id: int, epoch_id: int) -> bool:
        steady_spark_archives()
        ctx = _task_context()
        query = identity.of_real_time_task(
            ctx.getLocalProperty("sql.streaming.queryId") if ctx else None,
            self.checkpoint_location, self.name)
        exactly_once = self.guarantee is Guarantee.EXACTLY_ONCE
        if exactly_once:
            query.require(self.name)
        elif not query.durable:
            query = dataclasses.replace(query, run_key=self.run_key)
        self._refuse_recorded(epoch_id, partition_id)
        if self.checkpoint_location:
            _record_partition(self.checkpoint_location, query.key, self.name, partition_id)
        this = _attempt_of(ctx)
        if this is None and ctx is not None and exactly_once:
            raise ConfigurationError(
                f"the task of epoch {epoch_id}, partition {partition_id} carries no query "
                f"run ID (the local property {RUN_ID_PROPERTY}): which attempt of the "
                "epoch Spark counts cannot be told", sink=self.name, batch_id=epoch_id,
                fix="run the query as a streaming query started by Spark (its tasks get "
                "the run ID), or use at_least_once_writer")
        attempt = ctx.attemptNumber() if ctx else 0
        txn = query.pool(self.name).transaction(epoch_id, partition_id, 0, attempt)
        self._abandon_unclosed()
        self._started = time.perf_counter()
        self._opening = Opening(functools.partial(self._open_transaction, query, txn, this),
                                ahead=self.open_ahead)
        return True

    def _open_transaction(self, query: identity.QueryIdentity, txn: Transaction,
                          this: AttemptOf | None) -> tuple[Any, EpochPositions]:
        """Peek, fence, read the mark: the epoch's transaction, ready for rows."""
        exactly_once = self.guarantee is Guarantee.EXACTLY_ONCE
        if exactly_once:
            # Before the fence: a superseded attempt must not fence the one Spark counts
            # (it would fail that task for nothing).
            epochchecks.refuse_superseded(
                self.name, epochchecks.peek(self.participant, self.name, txn), txn, this)
        handle = self.participant.open_epoch(txn)
        try:
            recorded = self.participant.epoch_mark(handle)
            mark = Mark.from_json(recorded) if recorded is not None else None
            if not query.durable:
                mark = None  # nothing on record is known to be this query's: write all
            epochchecks.refuse_superseded(self.name, mark, txn, this)
            if mark is None and exactly_once and self.existing_output == "refuse":
                epochchecks.refuse_existing_output(self.participant, self.name,
                                                   self.destination, query.key, txn)
            positions = EpochPositions(mark, txn.batch_id, exactly_once, self.name,
                                       txn.partition, this)
        except BaseException:
            self.participant.abort_epoch(handle)
            raise
        self._open_ms = (time.perf_counter() - self._started) * 1000
        log_event("realtime.epoch_open", sink=self.name, query=query.key, batch=txn.batch_id,
                  partition=txn.partition, txn=txn.txn_id, start=positions.start,
                  replay=positions.replay, ms=round(self._open_ms, 1))
        return handle, positions

    def _await_open(self) -> None:
        """Wait for the epoch's open (it may run ahead of the rows); raise what it
        raised, each time."""
        if self._opening is not None and self._handle is None:
            self._handle, self._positions = self._opening.result()

    def _abandon_unclosed(self) -> None:
        """An epoch this object opened and nobody closed (Spark always closes; a
        caller of its own may not): its transaction is aborted, never reused."""
        if self._opening is not None:
            try:
                self._await_open()
            except BaseException:  # its open failed: nothing was opened
                pass
        if self._handle is not None:
            self._abort_quietly(self._handle)
        self._reset()

    def process(self, row: Any) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.rows_per_write:
            self._write_rows()

    def close(self, error: BaseException | None) -> None:
        try:
            self._await_open()
        except BaseException:
            self._reset()
            if error is None:
                raise  # rows were read that nothing can commit: the task must fail
            return
        handle, positions = self._handle, self._positions
        if handle is None or positions is None:
            return
        try:
            if error is not None:
                self.participant.abort_epoch(handle)
                return
            self._write_rows()
            rest, mark = positions.finish()
            for rows in rest:
                self._write(rows)
            # Every epoch commits its mark, one with no row too: the mark stays current
            # (a broker keeps a marker offset only so long) and says where the epoch
            # ended, which a replay that read nothing must record.
            self._refuse_recorded(positions.epoch, positions.partition)
            self.faults.epoch("epoch_before_commit", positions.epoch, positions.partition)
            committing = time.perf_counter()
            self.participant.commit_epoch(handle, mark.as_json())
            self.faults.epoch("epoch_after_commit", positions.epoch, positions.partition)
            self.last_epoch = {
                "epoch": positions.epoch, "partition": positions.partition,
                "rows": self._written, "skipped": positions.skipped,
                "open_ms": round(self._open_ms, 1),
                "commit_ms": round((time.perf_counter() - committing) * 1000, 1),
                "ms": round((time.perf_counter() - self._started) * 1000, 1)}
            log_event("realtime.epoch_committed", sink=self.name, end=mark.end,
                      **self.last_epoch)
        except BaseException:
            self._abort_quietly(handle)
            raise
        finally:
            self._reset()

    # -- rows ------------------------------------------------------------------------------
    def _write_rows(self) -> None:
        if not self._rows:
            return
        self._await_open()
        if self._positions is None:
            return
        rows, self._rows = self._rows, []
        if self._fields is None:
            self._fields = list(getattr(rows[0], "__fields__", None) or
                                [f"_{i}" for i in range(len(rows[0]))])
        columns = list(zip(*rows, strict=True))
        for name, column in zip(self._fields, columns, strict=True):
            _refuse_nested(name, column, self.name)
        batch = pa.RecordBatch.from_arrays(
            [pa.array(_plain(column)) for column in columns], names=self._fields)
        for rows in self._positions.take(self.participant.epoch_rows(batch)):
            self._write(rows)

    def _refuse_recorded(self, epoch: int, partition: int) -> None:
        """An attempt of an epoch Spark has recorded as done (``commits/<epoch>`` in the
        query's checkpoint) is a zombie: another attempt's rows and mark are the ones
        Spark counted, so this one must not commit (it would move the mark)."""
        if self.guarantee is not Guarantee.EXACTLY_ONCE or not self.checkpoint_location:
            return
        if _spark_recorded(self.checkpoint_location, epoch):
            raise AttemptFencedError(
                f"epoch {epoch} of partition {partition} is recorded by Spark as done: this "
                "attempt of it came late and writes nothing", sink=self.name, batch_id=epoch,
                fix="nothing to do: Spark discards this attempt; the epoch's rows are "
                "committed by the attempt Spark counted")

    def _write(self, rows: pa.RecordBatch) -> None:
        self.participant.write_epoch(self._handle, rows)
        first = not self._written
        self._written += rows.num_rows
        if first and self._positions is not None:
            self.faults.epoch("epoch_mid_write", self._positions.epoch,
                              self._positions.partition)

    def _abort_quietly(self, handle: Any) -> None:
        try:
            self.participant.abort_epoch(handle)
        except Exception as exc:  # the error being raised is the one that matters
            log_event("realtime.abort_failed", logging.WARNING, sink=self.name,
                      cause=repr(exc)[:200])


# What the writer leaves for ``sparkeos status`` / ``recover`` (the model check replaces
# them: its checkpoint holds no files).
_record_writer = epochrecord.record_writer
_record_partition = epochrecord.record_partition


def _task_context() -> Any:
    """Spark's ``TaskContext`` of the running task (None outside a task)."""
    from pyspark import TaskContext

    return TaskContext.get()


RUN_ID_PROPERTY = "spark.jobGroup.id"
"""The task's local property holding the query run's ID (Spark runs each run's jobs in a
job group named by it; measured in real-time mode: the run ID, another at each start)."""


def _attempt_of(ctx: Any) -> AttemptOf | None:
    """Which attempt the running task is, None where it cannot be told."""
    run = ctx.getLocalProperty(RUN_ID_PROPERTY) if ctx is not None else None
    if not run:
        return None
    return AttemptOf(str(run), int(ctx.taskAttemptId()))


def _spark_recorded(checkpoint: str, epoch: int) -> bool:
    from sparkeos.core.storage.registry import split_uri

    files, path = split_uri(checkpoint)
    return bool(files.exists(f"{path.rstrip('/')}/commits/{epoch}"))


def _refuse_speculation(name: str) -> None:
    """Two attempts of one epoch's partition may end at different rows; which one Spark
    counts is not known to the writer. Speculation makes such pairs routine."""
    try:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        speculating = spark is not None and str(
            spark.conf.get("spark.speculation", "false")).lower() == "true"
    except Exception:  # no session to ask (a test, a session of another kind)
        return
    if speculating:
        raise ConfigurationError(
            "exactly_once_writer cannot run with spark.speculation=true: two attempts of "
            "one epoch's partition would each commit rows, ending at different rows",
            sink=name, fix="turn speculation off for this application, or use "
            "foreachBatch(exactly_once(...)) with a micro-batch trigger")


def _refuse_nested(name: str, values: tuple[Any, ...], sink: str) -> None:
    """Struct and map values reach a ForeachWriter as Rows and dicts, whose Arrow types
    would depend on the other rows of the same write (a map's keys): a row would not be
    known again by its content."""
    first = next((v for v in values if v is not None), None)
    if isinstance(first, list):
        first = next((v for v in first if v is not None), None)
    if isinstance(first, (dict, tuple)):
        raise ConfigurationError(
            f"column {name!r} holds {'maps' if isinstance(first, dict) else 'structs'}, "
            "which the real-time writer does not take yet", sink=sink,
            fix=f"write it as JSON text: .withColumn({name!r}, to_json({name!r}))")


def _plain(values: tuple[Any, ...]) -> list[Any]:
    """Spark hands binary values to Python as ``bytearray``; Arrow wants ``bytes``."""
    return [bytes(v) if isinstance(v, bytearray) else v for v in values]


def exactly_once_writer(sink: TransactionalSink[Any], name: str, *,
                        checkpoint_location: str | None = None,
                        rows_per_write: int = ROWS_PER_WRITE,
                        existing_output: str = "refuse") -> EpochWriter:
    """A ForeachWriter for ``df.writeStream.foreach(...)`` that writes each row once, in
    real-time mode (``trigger(realTime=...)``) and under micro-batch triggers.

    ``name`` identifies the sink within the query and must stay the same across
    restarts. ``checkpoint_location``: the query's, where the tasks can read it (the
    query's identity is also read from the running query). ``existing_output``: a new
    query (checkpoint) over a destination that holds another query's output of this
    name is refused ('refuse', the default: a lost checkpoint would write it all again),
    or written beside it ('accept')."""
    return EpochWriter(sink, name, Guarantee.EXACTLY_ONCE, checkpoint_location,
                       rows_per_write, existing_output)


def at_least_once_writer(sink: TransactionalSink[Any], name: str, *,
                         checkpoint_location: str | None = None,
                         rows_per_write: int = ROWS_PER_WRITE) -> EpochWriter:
    """As ``exactly_once_writer``, but a replay whose rows cannot be checked, or differ,
    is written again (it may duplicate, never lose)."""
    return EpochWriter(sink, name, Guarantee.AT_LEAST_ONCE, checkpoint_location,
                       rows_per_write)


__all__ = ["EpochWriter", "at_least_once_writer", "exactly_once_writer"]
