"""The real-time mode writer (core.streaming.realtime) with an in-memory epoch
participant: what Spark's ForeachWriter calls, in the orders a crash leaves."""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import Row

from sparkeos.core.errors import (
    AttemptFencedError,
    CommitLogError,
    ConfigurationError,
    ReplayMismatchError,
)
from sparkeos.core.protocol import EpochParticipant, JsonDict, Transaction
from sparkeos.core.streaming.realtime import (
    EpochWriter,
    at_least_once_writer,
    exactly_once_writer,
)
from sparkeos.testing.epochsinks import EpochOnlySink, NoMicroBatchSink, TaskContextOf


@dataclass
class Open:
    txn: Transaction
    rows: list[int] = field(default_factory=list)


@dataclass
class Memory(EpochParticipant[Open]):
    """A transactional destination: rows and one mark per partition, changed together."""

    rows: dict[int, list[int]] = field(default_factory=dict)
    marks: dict[int, JsonDict] = field(default_factory=dict)
    participants: set[str] = field(default_factory=set)
    opened: int = 0
    other_output: str | None = None
    """What ``output_of_other_queries`` says (another query's output of the name)."""

    def output_of_other_queries(self, query_key: str, sink: str) -> str | None:
        return self.other_output

    def peek_mark(self, txn: Transaction) -> JsonDict | None:
        return self.marks.get(txn.partition)

    fail_open: Exception | None = None
    aborted: int = 0

    def open_epoch(self, txn: Transaction) -> Open:
        if self.fail_open is not None:
            raise self.fail_open
        self.participants.add(txn.participant_id)
        self.opened += 1
        return Open(txn)

    def epoch_mark(self, handle: Open) -> JsonDict | None:
        return self.marks.get(handle.txn.partition)

    def write_epoch(self, handle: Open, rows: pa.RecordBatch) -> None:
        handle.rows += rows.column("id").to_pylist()

    def commit_epoch(self, handle: Open, mark: JsonDict) -> None:
        self.rows.setdefault(handle.txn.partition, []).extend(handle.rows)
        self.marks[handle.txn.partition] = json.loads(json.dumps(mark))

    def abort_epoch(self, handle: Open) -> None:
        self.aborted += 1
        handle.rows.clear()


def MemorySink(memory: Memory) -> EpochOnlySink:
    return EpochOnlySink(memory)


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    # A query of its own per test: what a process learned of one query stays learned.
    (tmp_path / "metadata").write_text(json.dumps({"id": f"query-{tmp_path.name}"}) + "\n")
    return str(tmp_path)


def epoch(writer: EpochWriter, partition: int, epoch_id: int, ids: list[int],
          commit: bool = True) -> None:
    """One attempt, as Spark drives it; ``commit=False``: the task dies before close."""
    assert writer.open(partition, epoch_id)
    for i in ids:
        writer.process(Row(id=i, payload=f"row-{i}"))
    if commit:
        writer.close(None)


def test_a_replay_that_ends_elsewhere_writes_each_row_once(checkpoint: str) -> None:
    memory = Memory()
    writer = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint,
                                 rows_per_write=3)
    epoch(writer, 0, 0, list(range(10)))
    epoch(writer, 0, 1, list(range(10, 25)))          # committed; Spark did not record it
    epoch(writer, 0, 1, list(range(10, 17)))          # the replay ends sooner
    epoch(writer, 0, 2, list(range(17, 40)))          # epoch 2 goes on from row 17
    epoch(writer, 1, 0, [100, 101], commit=False)     # died before close: nothing
    epoch(writer, 1, 0, [100, 101, 102])
    assert memory.rows == {0: list(range(40)), 1: [100, 101, 102]}


def test_a_replay_with_other_rows_stops_exactly_once_and_is_written_at_least_once(
        checkpoint: str) -> None:
    memory = Memory()
    writer = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint)
    epoch(writer, 0, 0, [1, 2, 3])
    with pytest.raises(ReplayMismatchError, match="partition 0 of epoch 0"):
        epoch(writer, 0, 0, [1, 5, 3, 4])
    assert memory.rows == {0: [1, 2, 3]}
    loose = at_least_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint)
    epoch(loose, 0, 0, [1, 5, 3, 4])
    assert memory.rows == {0: [1, 2, 3, 1, 5, 3, 4]}


def test_an_empty_epoch_commits_its_mark_and_an_old_epoch_is_refused(checkpoint: str) -> None:
    memory = Memory()
    writer = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint)
    epoch(writer, 0, 3, [])
    assert memory.marks[0]["epoch"] == 3 and memory.marks[0]["end"] == 0
    epoch(writer, 0, 4, [7])
    with pytest.raises(CommitLogError, match="epoch 4 of it is committed already"):
        epoch(writer, 0, 2, [7])


def test_the_writer_is_pickled_without_a_task_state_and_refuses_what_it_cannot_do(
        checkpoint: str, tmp_path: Path) -> None:
    memory = Memory()
    writer = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint)
    writer.open(0, 0)
    writer.process(Row(id=1, payload="a"))
    copy = pickle.loads(pickle.dumps(writer))
    assert copy._handle is None and copy._rows == []
    with pytest.raises(ConfigurationError, match="cannot write in real-time mode"):
        exactly_once_writer(NoMicroBatchSink(), "out", checkpoint_location=checkpoint)
    from sparkeos.core.snapshot.group import SinkGroup

    with pytest.raises(ConfigurationError, match="takes one sink, not a SinkGroup"):
        exactly_once_writer(SinkGroup({"a": MemorySink(memory)}),  # type: ignore[arg-type]
                            "out", checkpoint_location=checkpoint)
    with pytest.raises(ConfigurationError, match="needs the query's checkpoint_location"):
        exactly_once_writer(MemorySink(memory), "out")
    with pytest.raises(ConfigurationError, match="exactly-once needs the query's identity"):
        exactly_once_writer(MemorySink(memory), "out",
                            checkpoint_location=str(tmp_path / "none")).open(0, 0)


def test_an_attempt_of_an_epoch_spark_recorded_is_fenced(checkpoint: str) -> None:
    """A zombie: Spark counted another attempt of the epoch (``commits/<epoch>``), so
    this one neither opens nor, if it opened before, commits."""
    memory = Memory()
    writer = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint)
    epoch(writer, 0, 0, [1, 2])
    late = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint)
    epoch(late, 0, 1, [3, 4], commit=False)
    epoch(writer, 0, 1, [3])
    (Path(checkpoint) / "commits").mkdir()
    (Path(checkpoint) / "commits" / "1").write_text("v1\n{}\n")
    with pytest.raises(AttemptFencedError, match="recorded by Spark as done"):
        late.close(None)
    with pytest.raises(AttemptFencedError):
        epoch(writer, 0, 1, [3])
    assert memory.rows == {0: [1, 2, 3]}


def test_at_least_once_writes_held_rows_of_chunks_with_other_types(checkpoint: str) -> None:
    """Rows a replay skipped are written one chunk at a time: a column of nulls only in
    one chunk has another Arrow type than in the next."""
    memory = Memory()
    loose = at_least_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint,
                                 rows_per_write=2)
    epoch(loose, 0, 0, [1, 2, 3, 4])
    assert loose.open(0, 0)
    for i, payload in ((1, None), (2, None), (3, "c")):
        loose.process(Row(id=i, payload=payload))
    loose.close(None)
    assert memory.rows[0] == [1, 2, 3, 4, 1, 2, 3]


def test_struct_and_map_columns_are_refused_with_the_fix(checkpoint: str) -> None:
    memory = Memory()
    writer = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint)
    assert writer.open(0, 0)
    writer.process(Row(id=1, payload={"a": 1}))
    with pytest.raises(ConfigurationError, match="to_json"):
        writer.close(None)
    assert writer.open(0, 0)
    writer.process(Row(id=1, payload=[Row(k="a", v=1)]))
    with pytest.raises(ConfigurationError, match="holds structs"):
        writer.close(None)
    assert memory.rows == {}


def test_an_attempt_a_later_one_of_its_run_superseded_writes_nothing(
        checkpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spark counted task 4 lost and ran task 9 for the same partition and epoch, which
    committed rows 1-2; task 4 ran on and opens now: it would commit its own end (row 3
    too), where the next epoch does not start. A replay after a restart (another run) is
    written as usual. Task 4 is refused before it opens, which fences: the fence would
    fail the attempt Spark counts for nothing."""
    from sparkeos.core.streaming import realtime

    memory = Memory()
    writer = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint)
    monkeypatch.setattr(realtime, "_task_context", lambda: TaskContextOf("run-a", 9))
    epoch(writer, 0, 0, [1, 2])
    assert memory.marks[0]["by"] == {"run": "run-a", "task": 9}
    monkeypatch.setattr(realtime, "_task_context", lambda: TaskContextOf("run-a", 4))
    opened = memory.opened
    with pytest.raises(AttemptFencedError, match="committed by a later attempt"):
        epoch(writer, 0, 0, [1, 2, 3])
    assert memory.opened == opened, "refused only after it opened (fenced) the partition"
    monkeypatch.setattr(realtime, "_task_context", lambda: TaskContextOf("run-b", 0))
    epoch(writer, 0, 0, [1, 2, 3])
    assert memory.rows == {0: [1, 2, 3]}


def test_a_task_without_a_run_id_is_refused_under_exactly_once(
        checkpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Spark's run ID a zombie cannot be told from the attempt Spark counts:
    exactly-once fails closed; at-least-once writes (it may duplicate)."""
    from sparkeos.core.streaming import realtime

    memory = Memory()
    monkeypatch.setattr(realtime, "_task_context", lambda: TaskContextOf("", 3))
    writer = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint)
    with pytest.raises(ConfigurationError, match="carries no query run ID"):
        epoch(writer, 0, 0, [1])
    epoch(at_least_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint),
          0, 0, [1])
    assert memory.rows == {0: [1]}


def test_a_partition_without_a_mark_over_other_queries_output_is_refused(
        checkpoint: str) -> None:
    """The lost-checkpoint guard: asked only while a partition has no mark of this query;
    refused under exactly-once (nothing written), unless existing_output='accept'."""
    memory = Memory(other_output="marks of query key 9f2e")
    with pytest.raises(ConfigurationError, match="another query"):
        epoch(exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint),
              0, 0, [1, 2])
    assert memory.rows == {}
    accepting = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint,
                                    existing_output="accept")
    epoch(accepting, 0, 0, [1, 2])
    epoch(exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint),
          0, 1, [3])  # the partition has a mark of this query now: not asked
    assert memory.rows == {0: [1, 2, 3]}
    with pytest.raises(ConfigurationError, match="existing_output"):
        exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint,
                            existing_output="skip")


def test_an_open_that_fails_ahead_of_the_rows_fails_the_task_every_time_it_is_asked(
        checkpoint: str) -> None:
    """The transaction opens on a thread while rows arrive: its failure reaches the
    task at the first write, again at close(None) (rows were read that nothing can
    commit), and close(error) ends quietly; nothing is committed."""
    memory = Memory(fail_open=ConnectionError("broker down"))
    writer = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint,
                                 rows_per_write=2)
    assert writer.open(0, 0)
    writer.process(Row(id=1, payload="a"))
    with pytest.raises(ConnectionError):
        writer.process(Row(id=2, payload="b"))
    with pytest.raises(ConnectionError):
        writer.close(None)
    assert writer.open(0, 0)
    writer.close(RuntimeError("the task failed"))
    assert memory.rows == {} and memory.marks == {}


def test_an_epoch_left_unclosed_is_aborted_by_the_next_open(checkpoint: str) -> None:
    memory = Memory()
    writer = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint,
                                 rows_per_write=1)
    epoch(writer, 1, 0, [7], commit=False)
    epoch(writer, 0, 0, [1, 2])
    assert memory.aborted == 1 and memory.rows == {0: [1, 2]} and set(memory.marks) == {0}


def test_the_writer_records_itself_and_its_partitions_for_status_and_recover(
        checkpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    from sparkeos.cli import main
    from sparkeos.core.streaming import epochrecord

    memory = Memory()
    writer = exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint)
    epoch(writer, 0, 0, [1])
    epoch(writer, 1, 0, [2])
    directory = Path(epochrecord.sink_directory(checkpoint, "out"))
    assert epochrecord.recorded_partitions(os.listdir(directory)) == [0, 1]
    assert json.loads((directory / "sink.json").read_text())["route"] == "realtime"
    assert main(["status", checkpoint]) == 0
    assert "real-time writer" in capsys.readouterr().out
    assert main(["recover", "--dry-run", checkpoint]) == 0
    assert "would fence partitions [0, 1]" in capsys.readouterr().out
    assert main(["recover", checkpoint]) == 2  # no lease tells a running query
    assert "stop the query" in capsys.readouterr().err
    (directory / "sink.json").write_text(json.dumps({"sink_type": "x"}))  # micro-batch's
    with pytest.raises(ConfigurationError, match="micro-batch commit log"):
        exactly_once_writer(MemorySink(memory), "out", checkpoint_location=checkpoint)
