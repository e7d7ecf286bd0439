"""The replay rule of real-time mode (core.snapshot.positions): a partition's rows are
known by position, so a replay that ends elsewhere than the attempt that committed still
writes every row once."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkeos.core.errors import CommitLogError, ReplayMismatchError
from sparkeos.core.snapshot.positions import (
    AttemptOf,
    Digest,
    EpochPositions,
    Mark,
    resume,
    superseded,
)


def rows(values: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"v": pa.array(values, pa.int64())})


def ids(batches: list[pa.RecordBatch]) -> list[int]:
    return [i for batch in batches for i in batch.column(0).to_pylist()]


@dataclass
class Destination:
    """What a transactional destination holds: rows and the partition's mark, changed
    together by a commit."""

    rows: list[int] = field(default_factory=list)
    mark: Mark | None = None


def attempt(dest: Destination, epoch: int, stream: list[int], cuts: list[int],
            exactly_once: bool = True, commit: bool = True) -> EpochPositions:
    """One attempt of ``epoch``: reads ``stream`` from where the writer resumes, in
    batches of ``cuts`` rows, and commits (rows and mark at once) if ``commit``."""
    positions = EpochPositions(dest.mark, epoch, exactly_once, "s", 0)
    written: list[int] = []
    at = positions.position
    for size in cuts:
        written += ids(positions.take(rows(stream[at:at + size])))
        at += size
    rest, mark = positions.finish()
    written += ids(rest)
    if commit:
        dest.rows += written
        dest.mark = mark
    return positions


def test_a_short_replay_skips_what_was_committed_and_the_next_epoch_goes_on_from_it() -> None:
    stream = list(range(100))
    dest = Destination()
    attempt(dest, 0, stream, [10])            # epoch 0: rows 0-9, recorded by Spark
    attempt(dest, 1, stream, [20])            # epoch 1: rows 10-29 committed, not recorded
    replay = attempt(dest, 1, stream, [5])    # Spark replays epoch 1, ending after 5 rows
    assert replay.replay and replay.start == 10 and replay.skipped == 5
    nxt = attempt(dest, 2, stream, [30])      # epoch 2 starts where the replay ended
    assert nxt.start == 15 and nxt.skipped == 15
    assert dest.rows == list(range(45))


def test_a_long_replay_writes_only_the_rows_past_the_commit() -> None:
    stream = list(range(100))
    dest = Destination()
    attempt(dest, 0, stream, [10, 10])
    attempt(dest, 0, stream, [7, 7, 7, 7])   # the replay of epoch 0 goes on to row 27
    assert dest.rows == list(range(28))
    assert dest.mark is not None and dest.mark.through == 28


def test_other_rows_on_a_replay_stop_exactly_once_and_are_written_at_least_once() -> None:
    dest = Destination()
    attempt(dest, 0, list(range(10)), [10])
    changed = [0, 1, 2, 99, 4, 5, 6, 7, 8, 9, 10]
    with pytest.raises(ReplayMismatchError, match="below position 10"):
        attempt(dest, 0, changed, [11])
    assert dest.rows == list(range(10))
    attempt(dest, 0, changed, [4, 7], exactly_once=False)
    assert dest.rows == list(range(10)) + changed


def test_at_least_once_writes_rows_it_cannot_check_by_the_end_of_its_epoch() -> None:
    stream = list(range(50))
    dest = Destination()
    attempt(dest, 0, stream, [20], exactly_once=False)
    attempt(dest, 0, stream, [5], exactly_once=False)   # a short replay: 0-4 unchecked
    assert dest.rows == list(range(20)) + list(range(5))
    attempt(dest, 1, stream, [10], exactly_once=False)  # goes on from 5, writes 5-14 again
    assert sorted(set(dest.rows)) == list(range(20))


def test_an_epoch_older_than_the_mark_is_refused() -> None:
    mark = Mark(4, 10, 20, 20, Digest(), Digest(), Digest())
    with pytest.raises(CommitLogError, match="epoch 4 of it is committed already"):
        resume(mark, 3, sink="s", partition=0)


def test_a_mark_survives_its_json_and_a_foreign_one_is_refused() -> None:
    dest = Destination()
    attempt(dest, 0, list(range(10)), [10])
    assert dest.mark is not None
    assert Mark.from_json(dest.mark.as_json()) == dest.mark
    with pytest.raises(CommitLogError, match="cannot be read"):
        Mark.from_json({"epoch": 1})
    with pytest.raises(CommitLogError, match="inconsistent"):
        Mark.from_json({**dest.mark.as_json(), "start": 11})


def test_the_digest_is_additive_over_any_cut() -> None:
    from sparkeos.core.snapshot.fingerprint import row_hashes

    hashes = row_hashes(rows(list(range(30))))
    whole = Digest().plus(hashes, 0)
    assert Digest().plus(hashes[:12], 0).plus(hashes[12:], 12) == whole
    assert Digest().plus(hashes[:12], 1).plus(hashes[12:], 13) != whole


# -- every interleaving of commits, crashes and replays of other lengths -------------------
STEP = st.tuples(
    st.lists(st.integers(0, 7), max_size=4),   # the attempt's batches (rows each)
    st.sampled_from(["recorded", "committed_then_crash", "crash_before_commit"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, max_size=12))
def test_every_row_once_whatever_the_replays(steps: list[tuple[list[int], str]]) -> None:
    """Spark's side is modelled as its offset log: the position where the next epoch
    starts. An attempt reads from there, commits or not, and Spark records its end only
    when it is ``recorded``; else the epoch is replayed, ending elsewhere. The writer must
    always resume where Spark does, and the destination holds each row once, in order."""
    stream = list(range(1000))
    dest = Destination()
    spark_position, epoch = 0, 0
    for cuts, outcome in steps:
        positions = attempt(dest, epoch, stream[:spark_position] + stream[spark_position:],
                            cuts, commit=outcome != "crash_before_commit")
        assert positions.start == spark_position
        if outcome == "recorded":
            spark_position += sum(cuts)
            epoch += 1
    assert dest.rows == list(range(len(dest.rows)))
    assert len(dest.rows) >= spark_position


@settings(max_examples=200, deadline=None)
@given(st.lists(STEP, max_size=10), st.integers(0, 40), st.integers(1000, 2000))
def test_at_least_once_never_loses_a_row(steps: list[tuple[list[int], str]],
                                         changed_at: int, new_value: int) -> None:
    """At-least-once with a replay that changes a row: every row of what Spark recorded
    is in the destination (some may be twice)."""
    stream = list(range(1000))
    dest = Destination()
    spark_position, epoch = 0, 0
    recorded: list[int] = []
    for index, (cuts, outcome) in enumerate(steps):
        seen = list(stream)
        if index % 2:
            seen[changed_at] = new_value
        attempt(dest, epoch, seen, cuts, exactly_once=False,
                commit=outcome != "crash_before_commit")
        if outcome == "recorded":
            recorded += seen[spark_position:spark_position + sum(cuts)]
            spark_position += sum(cuts)
            epoch += 1
    missing = [r for r in recorded if r not in dest.rows]
    assert not missing


def test_an_attempt_is_a_dataclass_of_plain_fields() -> None:
    # Spark pickles the ForeachWriter to its tasks; an attempt is made in the task.
    positions = EpochPositions(None, 0, True, "s", 3)
    assert dataclasses.asdict(positions)["partition"] == 3


def test_an_attempt_is_superseded_only_by_a_later_one_of_its_own_run() -> None:
    """``superseded``: Spark counts the newest attempt of a task; a zombie of the same
    run must not move the mark. Another run's attempt is a replay (positions decide)."""
    mark = Mark(3, 0, 5, 5, Digest(), Digest(), Digest(), AttemptOf("run-a", 17))
    assert Mark.from_json(mark.as_json()) == mark
    assert superseded(mark, 3, AttemptOf("run-a", 12))       # started before it
    assert not superseded(mark, 3, AttemptOf("run-a", 17))   # itself
    assert not superseded(mark, 3, AttemptOf("run-a", 20))   # a retry (its reply lost)
    assert not superseded(mark, 3, AttemptOf("run-b", 0))    # a replay after a restart
    assert not superseded(mark, 4, AttemptOf("run-a", 12))   # the next epoch
    assert superseded(mark, 2, AttemptOf("run-a", 12))       # a zombie of an older one
    assert not superseded(mark, 3, None)
    assert not superseded(Mark(3, 0, 5, 5, Digest(), Digest(), Digest()), 3,
                          AttemptOf("run-a", 12))
