"""`sparkeos status` and `sparkeos recover` on a commit log a crash left behind."""

from __future__ import annotations

import os

import pytest

from sparkeos.cli import main
from sparkeos.connectors.file import FileSink, read_output
from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.faults import FaultPlan, InjectedCrash
from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.storage.logstores import open_store
from sparkeos.core.streaming.adapter import ForeachBatchAdapter
from sparkeos.testing.inprocess import ListRunner


def crashed_checkpoint(tmp_path, point: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "out")
    sink = FileSink(out)
    config = CoordinatorConfig(name="files")
    log = CommitLog(open_store(sink_log_location(ckpt, "files")))
    key = ForeachBatchAdapter(sink, config)._claim_log(log, "query-1")
    coord = Coordinator(sink, config, log, key)
    coord.run_batch(0, ListRunner([[1], [2]]))
    crashing = Coordinator(sink, config, log, key, FaultPlan(point, 1, simulate=True))
    with pytest.raises(InjectedCrash):
        crashing.run_batch(1, ListRunner([[3], [4]]))
    return ckpt, out


def ids(out: str) -> list[int]:
    return sorted(read_output(out).column("id").to_pylist())


def test_status_shows_outstanding_transactions(tmp_path, capsys):
    ckpt, _ = crashed_checkpoint(tmp_path, "after_decided")
    assert main(["status", ckpt]) == 0
    text = capsys.readouterr().out
    assert "decided" in text and "unresolved batches: 1" in text
    assert "outstanding seos-" in text and "recovery will commit" in text


def test_status_probe_asks_the_destination(tmp_path, capsys):
    ckpt, _ = crashed_checkpoint(tmp_path, "after_all_prepared")
    assert main(["status", ckpt, "--probe"]) == 0
    text = capsys.readouterr().out
    assert text.count("destination holds: prepared") == 2


def test_status_json(tmp_path, capsys):
    import json

    ckpt, _ = crashed_checkpoint(tmp_path, "after_all_prepared")
    assert main(["status", ckpt, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    last = report[0]["batches"][-1]
    assert last["status"] == "begun" and last["will"] == "roll back"
    assert len(last["outstanding_txn_ids"]) == 2


@pytest.mark.parametrize("point,expected", [("after_decided", [1, 2, 3, 4]),
                                            ("after_all_prepared", [1, 2])])
def test_recover_finishes_or_rolls_back(tmp_path, capsys, point, expected):
    ckpt, out = crashed_checkpoint(tmp_path, point)
    assert main(["recover", ckpt, "--dry-run"]) == 0
    assert ids(out) == [1, 2]
    assert main(["recover", ckpt]) == 0
    assert ids(out) == expected
    assert main(["recover", ckpt]) == 0
    assert "nothing to recover" in capsys.readouterr().out


def test_unknown_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert main(["status", str(tmp_path / "nothing")]) == 2
    assert "no sparkeos sinks" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()


def test_recover_refuses_while_the_query_holds_its_lease(tmp_path, capsys):
    """A running query renews a lease; recover beside it would abort the batch it is
    writing, so it refuses unless --force (which is still safe: one outcome per run)."""
    import os
    import socket
    import time

    ckpt, out = crashed_checkpoint(tmp_path, "after_all_prepared")
    log = CommitLog(open_store(sink_log_location(ckpt, "files")))
    log.write_lease({"query_id": "query-1", "host": socket.gethostname(),
                     "pid": os.getpid(), "renewed": time.time(), "ttl_s": 300})
    assert main(["status", ckpt]) == 0
    assert f"(pid {os.getpid()}) renewed it" in capsys.readouterr().out
    assert main(["recover", ckpt]) == 2
    err = capsys.readouterr().err
    assert "QueryRunningError" not in err and "holds the lease" in err and "--force" in err
    assert log.batches()[1].needs_rollback
    assert main(["recover", ckpt, "--force"]) == 0
    assert "batch 1 rolled_back" in capsys.readouterr().out
    assert not log.batches()[1].unresolved and ids(out) == [1, 2]


def test_a_lease_of_a_dead_driver_does_not_block_recover(tmp_path, capsys):
    import socket
    import subprocess
    import time

    ckpt, _ = crashed_checkpoint(tmp_path, "after_decided")
    dead = subprocess.Popen(["true"])
    dead.wait()
    log = CommitLog(open_store(sink_log_location(ckpt, "files")))
    log.write_lease({"host": socket.gethostname(), "pid": dead.pid, "renewed": time.time(),
                     "ttl_s": 300})
    assert main(["recover", ckpt]) == 0
    assert "batch 1 committed" in capsys.readouterr().out


def test_status_shows_what_it_can_read_of_a_corrupt_log(tmp_path, capsys):
    """Issue 15, defect 8: a corrupt record once made `status` abort, `--json` print
    plain text, and the advice point back at `status` itself."""
    import json
    import os

    from sparkeos.core.snapshot.commitlog import OUTCOME, record_name

    ckpt, _ = crashed_checkpoint(tmp_path, "after_decided")
    log_dir = os.path.join(ckpt, "sparkeos", "files")
    with open(os.path.join(log_dir, record_name(1, OUTCOME, 0)), "w") as fh:
        fh.write("{truncated")
    assert main(["status", ckpt]) == 2
    out = capsys.readouterr().out
    assert "finished" in out  # batch 0 is still shown
    assert "UNREADABLE" in out and "not valid JSON" in out
    assert "sparkeos status" not in out
    assert main(["status", ckpt, "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report[0]["batches"][0]["status"] == "finished"
    assert "not valid JSON" in report[0]["unreadable"][0]
    assert main(["status", str(tmp_path / "nothing"), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"] == "ConfigurationError"


def test_recover_and_probe_a_sink_group(tmp_path, capsys):
    """A group's commit log: status probes every member, recover commits both."""
    from sparkeos.core.snapshot.group import SinkGroup

    ckpt = str(tmp_path / "ckpt")
    outs = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    group = SinkGroup({name: FileSink(path) for name, path in outs.items()})
    config = CoordinatorConfig(name="both")
    log = CommitLog(open_store(sink_log_location(ckpt, "both")))
    key = ForeachBatchAdapter(group, config)._claim_log(log, "query-2")

    def runners(*parts: list[int]) -> dict[str, ListRunner]:
        return {"a": ListRunner(list(parts)), "b": ListRunner([[i for p in parts for i in p]])}

    Coordinator(group, config, log, key).run_batch(0, runners([1], [2]))
    with pytest.raises(InjectedCrash):
        Coordinator(group, config, log, key, FaultPlan("after_first_commit", 1, simulate=True)
                    ).run_batch(1, runners([3], [4]))
    assert ids(outs["a"]) == [1, 2, 3] and ids(outs["b"]) == [1, 2]  # mid phase 2
    assert main(["status", ckpt, "--probe"]) == 0
    text = capsys.readouterr().out
    assert "SinkGroup" in text and "destination holds: prepared" in text
    assert main(["recover", ckpt]) == 0
    assert ids(outs["a"]) == ids(outs["b"]) == [1, 2, 3, 4]


@pytest.mark.parametrize("command", ["status", "recover"])
def test_a_record_purged_while_it_is_read_is_left_out(tmp_path, capsys, monkeypatch,
                                                      command):
    """The running query purges batch 0's records (in its order: begun, outcome,
    finished) between the CLI's listing and its reading them. `status` and `recover`
    carry on without batch 0 (a FileNotFoundError traceback before)."""
    from sparkeos.core.snapshot.commitlog import record_name
    from sparkeos.core.storage.logstores import LocalStore

    ckpt, out = crashed_checkpoint(tmp_path, "after_decided")
    purged = [record_name(0, "begun", 0), record_name(0, "outcome", 0),
              record_name(0, "finished")]
    reading = LocalStore.read

    def purged_before_read(self, name):  # type: ignore[no-untyped-def]
        if name == purged[0] and os.path.exists(os.path.join(self.directory, name)):
            for record in purged:  # listed a moment ago, purged now
                os.unlink(os.path.join(self.directory, record))
        return reading(self, name)

    monkeypatch.setattr(LocalStore, "read", purged_before_read)
    assert main([command, ckpt]) == 0
    text = capsys.readouterr().out
    if command == "status":
        assert "unresolved batches: 1" in text and "finished" not in text
    else:
        assert "batch 1 committed" in text and "batch 0" not in text
        assert ids(out) == [1, 2, 3, 4]


def test_recover_reads_the_lease_again_after_the_log(tmp_path, capsys, monkeypatch):
    """A format-route query releases its lease between batches and takes it again at
    the next planning, before ``begun``. A recover that found the lease released, then
    reads a log where the next batch has begun meanwhile, must refuse, not abort it:
    it reads the lease again once it read the log (``Coordinator.recover(guard=...)``)."""
    import socket
    import time

    from sparkeos.core.snapshot import recovery

    ckpt, _ = crashed_checkpoint(tmp_path, "after_all_prepared")
    log = CommitLog(open_store(sink_log_location(ckpt, "files")))
    log.write_lease({"query_id": "query-1", "host": socket.gethostname(), "pid": os.getpid(),
                     "renewed": time.time(), "ttl_s": 300, "released": True, "batch": 0})
    read_log = recovery.Scope.load_states

    def planning_meanwhile(scope):  # type: ignore[no-untyped-def]
        # The query's next planning: the lease first, then begun (here: batch 1 open).
        log.write_lease({"query_id": "query-1", "host": socket.gethostname(),
                         "pid": os.getpid(), "renewed": time.time(), "ttl_s": 300,
                         "batch": 1})
        return read_log(scope)

    monkeypatch.setattr(recovery.Scope, "load_states", planning_meanwhile)
    assert main(["recover", ckpt]) == 2
    assert "holds the lease" in capsys.readouterr().err
    assert log.batches()[1].needs_rollback, "the live batch was aborted"


def test_status_says_a_format_query_released_its_lease_between_batches(tmp_path, capsys):
    import socket
    import time

    ckpt, _ = crashed_checkpoint(tmp_path, "after_decided")
    log = CommitLog(open_store(sink_log_location(ckpt, "files")))
    log.write_lease({"query_id": "query-1", "host": socket.gethostname(), "pid": os.getpid(),
                     "renewed": time.time(), "ttl_s": 300, "released": True, "batch": 7})
    assert main(["status", ckpt]) == 0
    assert "released by query query-1 after batch 7" in capsys.readouterr().out
    assert main(["recover", ckpt]) == 0
