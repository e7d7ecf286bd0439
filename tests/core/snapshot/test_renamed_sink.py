"""A sink renamed over a batch it decided: the new name must not write that batch again
(its old log still holds it, and ``sparkeos recover`` of the checkpoint commits it)."""

from __future__ import annotations

from typing import Any

import pytest

from sparkeos.cli import main
from sparkeos.connectors.file import FileSink, read_output
from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import ConfigurationError
from sparkeos.core.faults import FaultPlan, InjectedCrash
from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.storage.logstores import open_store
from sparkeos.core.streaming.queryrun import claim_log
from sparkeos.testing.inprocess import ListRunner


def coordinator(ckpt: str, sink: FileSink, name: str, **settings: Any) -> Coordinator:
    log = CommitLog(open_store(sink_log_location(ckpt, name)))
    key = claim_log(log, "query-1", sink, name)
    return Coordinator(sink, CoordinatorConfig(name=name, **settings), log, key)


def test_a_renamed_sink_refuses_the_batch_its_old_name_decided(tmp_path: Any) -> None:
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    sink = FileSink(out)
    old = coordinator(ckpt, sink, "orders")
    old.run_batch(0, ListRunner([[1], [2]]))
    old.scope.faults = FaultPlan("after_decided", 1, simulate=True)
    with pytest.raises(InjectedCrash):
        old.run_batch(1, ListRunner([[3], [4]]))
    renamed = coordinator(ckpt, sink, "orders-v2")
    with pytest.raises(ConfigurationError, match=r"'orders'.*decided batch 1") as info:
        renamed.run_batch(1, ListRunner([[3], [4]]))  # Spark replays batch 1
    assert "old name 'orders'" in str(info.value)
    assert main(["recover", ckpt]) == 0  # walks both sinks: 'orders' commits batch 1
    assert sorted(read_output(out).column("id").to_pylist()) == [1, 2, 3, 4]
    # After the old name finished it, the batches after it are the new name's to write.
    renamed = coordinator(ckpt, sink, "orders-v2")
    renamed.run_batch(2, ListRunner([[5], [6]]))
    assert sorted(read_output(out).column("id").to_pylist()) == [1, 2, 3, 4, 5, 6]


def test_another_sink_of_the_checkpoint_on_another_destination_is_not_a_rename(
        tmp_path: Any) -> None:
    ckpt = str(tmp_path / "ckpt")
    first = coordinator(ckpt, FileSink(str(tmp_path / "a")), "a")
    first.run_batch(0, ListRunner([[1]]))
    second = coordinator(ckpt, FileSink(str(tmp_path / "b")), "b")
    second.run_batch(0, ListRunner([[1]]))
    assert read_output(str(tmp_path / "b")).num_rows == 1
