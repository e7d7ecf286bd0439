"""Conformance cases of an epoch participant (real-time mode), in process against the
real destination: the writer driven as Spark drives a ForeachWriter, with the replays
and zombies a crash leaves. Subclass ``EpochConformance`` and implement ``make_sink``
(a fresh sink of this test's destination) and ``visible_ids`` (every ``id`` a reader
sees now, duplicates included). Rows are ``Row(id=..., key=..., value=...)``: ``id``
as a number, ``key`` and ``value`` as bytes, so one row fits a table and a topic.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.protocol import TransactionalSink
from sparkeos.core.streaming import epochrecord, identity
from sparkeos.core.streaming.realtime import EpochWriter, exactly_once_writer

from .support import assert_exactly_once


def row(i: int) -> Any:
    from pyspark.sql import Row

    return Row(id=i, key=str(i).encode(), value=json.dumps({"id": i}).encode())


class EpochConformance:
    @pytest.fixture
    def workdir(self, tmp_path: Any) -> str:
        return str(tmp_path)

    def make_sink(self, workdir: str) -> TransactionalSink[Any]:
        raise NotImplementedError

    def visible_ids(self, workdir: str) -> list[int]:
        raise NotImplementedError

    def writer(self, workdir: str, checkpoint_name: str = "checkpoint",
               existing_output: str = "refuse") -> EpochWriter:
        checkpoint = Path(workdir) / checkpoint_name
        checkpoint.mkdir(exist_ok=True)
        (checkpoint / "metadata").write_text(
            json.dumps({"id": f"rt-{checkpoint}"}) + "\n")
        return exactly_once_writer(self.make_sink(workdir), "rt",
                                   checkpoint_location=str(checkpoint), rows_per_write=4,
                                   existing_output=existing_output)

    @staticmethod
    def epoch(writer: EpochWriter, partition: int, epoch: int, ids: range | list[int],
              close: bool = True) -> None:
        assert writer.open(partition, epoch)
        for i in ids:
            writer.process(row(i))
        if close:
            writer.close(None)

    def test_replays_that_end_sooner_and_later_write_each_row_once(self, workdir: str
                                                                   ) -> None:
        writer = self.writer(workdir)
        self.epoch(writer, 0, 0, range(0, 10))
        self.epoch(writer, 1, 0, range(100, 103))
        self.epoch(writer, 0, 1, range(10, 30))      # committed, then the driver died
        self.epoch(writer, 0, 1, range(10, 18))      # its replay ended sooner
        self.epoch(writer, 0, 2, range(18, 35))      # goes on from there
        self.epoch(writer, 1, 1, range(103, 103))    # nothing new: nothing committed
        self.epoch(writer, 1, 1, range(103, 110))    # the same epoch again, with rows
        assert_exactly_once(self.visible_ids(workdir),
                            [*range(0, 35), *range(100, 110)])

    def test_a_zombie_attempt_of_an_epoch_is_fenced(self, workdir: str) -> None:
        zombie, retry = self.writer(workdir), self.writer(workdir)
        self.epoch(zombie, 0, 0, range(0, 6), close=False)
        self.epoch(retry, 0, 0, range(0, 9))          # fences the zombie, commits
        with pytest.raises(Exception):  # noqa: B017 - whatever the destination says
            zombie.close(None)
        assert_exactly_once(self.visible_ids(workdir), list(range(0, 9)))
        self.epoch(self.writer(workdir), 0, 1, range(9, 12))
        assert_exactly_once(self.visible_ids(workdir), list(range(0, 12)))

    def test_an_attempt_that_fails_leaves_nothing(self, workdir: str) -> None:
        writer = self.writer(workdir)
        self.epoch(writer, 0, 0, range(0, 7), close=False)
        writer.close(RuntimeError("the task failed"))
        assert self.visible_ids(workdir) == []
        self.epoch(writer, 0, 0, range(0, 5))
        assert_exactly_once(self.visible_ids(workdir), list(range(0, 5)))

    def test_a_peek_fences_no_one_and_the_recover_fence_ends_open_epochs(self, workdir: str
                                                                           ) -> None:
        """``peek_mark`` reads the committed mark without ending the open attempt;
        ``sparkeos recover``'s fence (``epochrecord.fence_partitions``) ends every attempt
        of the partitions the writer recorded in the checkpoint."""
        writer = self.writer(workdir)
        self.epoch(writer, 0, 0, range(0, 5))
        checkpoint = str(Path(workdir) / "checkpoint")
        pool = identity.of_checkpoint(checkpoint).pool("rt")
        participant = writer.participant
        open_attempt = self.writer(workdir)
        open_attempt.open_ahead = False  # its fence comes before the peek below
        self.epoch(open_attempt, 0, 1, range(5, 8), close=False)
        mark = epochrecord.marks(participant, pool, [0])[0]
        assert mark is not None and mark["epoch"] == 0, mark
        open_attempt.close(None)                      # the peek fenced no one
        names = os.listdir(epochrecord.sink_directory(checkpoint, "rt"))
        assert epochrecord.recorded_partitions(names) == [0]
        left_open = self.writer(workdir)
        self.epoch(left_open, 0, 2, range(8, 12), close=False)
        epochrecord.fence_partitions(participant, pool, [0])
        with pytest.raises(Exception):  # noqa: B017 - whatever the destination says
            left_open.close(None)
        assert_exactly_once(self.visible_ids(workdir), list(range(0, 8)))

    def test_a_new_checkpoint_over_committed_output_is_refused(self, workdir: str) -> None:
        """The lost-checkpoint guard: a query with a new checkpoint (another query key)
        whose partition has no mark yet finds the output another query committed under
        the same name and refuses, writing nothing; ``existing_output='accept'`` writes
        beside it on purpose."""
        self.epoch(self.writer(workdir), 0, 0, range(0, 5))
        with pytest.raises(ConfigurationError, match="another query"):
            self.epoch(self.writer(workdir, "new-checkpoint"), 0, 0, range(0, 5))
        assert_exactly_once(self.visible_ids(workdir), list(range(0, 5)))
        self.epoch(self.writer(workdir, "new-checkpoint", existing_output="accept"), 0, 0,
                   range(5, 8))
        self.epoch(self.writer(workdir), 0, 1, range(8, 10))  # the first query goes on
        assert_exactly_once(self.visible_ids(workdir), list(range(0, 10)))


__all__ = ["EpochConformance", "row"]
