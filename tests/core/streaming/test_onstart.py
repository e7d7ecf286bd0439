"""The start hook's finishing thread (``core.streaming.onstart``) reads the stores' settings of
the session that started the query: in a new Python thread pyspark has no active
session, so an ``s3a://`` checkpoint's endpoint set only in the session
(``spark.hadoop.fs.s3a.endpoint``) would be looked for on Amazon S3. Simulated here
with a thread-local session, as the JVM keeps it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.storage.stores import s3, settings
from sparkeos.core.streaming import onstart

ACTIVE = threading.local()


class Session:
    class conf:
        getAll = {"spark.hadoop.fs.s3a.endpoint": "http://minio:9000"}


def test_the_finishing_thread_reads_the_session_s_endpoint(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for env in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setattr(settings, "_session_setting", lambda key: (
        Session.conf.getAll.get(key) if getattr(ACTIVE, "on", False) else None))
    monkeypatch.setattr(settings, "_task_property", lambda key: None)
    seen: list[tuple[str, Any]] = []
    original = s3.S3Files.from_environment.__func__  # type: ignore[attr-defined]

    def recorded(cls: Any, scheme: str, bucket: str) -> Any:
        files = original(cls, scheme, bucket)
        seen.append((threading.current_thread().name, files.endpoint))
        raise RuntimeError("stop before any request")

    monkeypatch.setattr(s3.S3Files, "from_environment", classmethod(recorded))
    ACTIVE.on = True  # the thread that starts the query has the session
    config = CoordinatorConfig(name="out", overlap_commits=True,
                               checkpoint_location="s3a://lake/ckpt")
    failure = onstart.Finishing(Session(), None, config, "q").wait()  # type: ignore[arg-type]
    assert failure is None  # a log it cannot read is not known to be its own: logged
    assert seen == [("sparkeos-onstart-out", "http://minio:9000")]


class _Finished:
    """A start's finishing thread that ended with ``error``."""

    def __init__(self, error: BaseException | None) -> None:
        self.thread = threading.Thread(target=lambda: None)
        self.thread.start()
        self.error, self.reported = error, False

    wait = onstart.Finishing.wait
    succeeded = onstart.Finishing.succeeded


def test_a_wait_for_a_running_query_keeps_its_start_for_the_first_batch(tmp_path: Any) -> None:
    """``processAllAvailable()`` of a query whose start is being finished waits for it
    without forgetting it (the query's first batch waits for the same thread), and
    raises its failure once."""
    from sparkeos import exactly_once
    from sparkeos.connectors.file import FileSink

    adapter = exactly_once(FileSink(str(tmp_path / "out")), name="out")
    adapter._finishing["q"] = _Finished(RuntimeError("the destination is down"))
    with pytest.raises(RuntimeError, match="down"):
        adapter.settle("q")
    assert "q" in adapter._finishing, "the first batch would not wait for the thread"
    adapter.settle("q")  # raised once
    assert adapter._await_finishing("q") is None
