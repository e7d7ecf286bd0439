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
    assert isinstance(failure, RuntimeError)
    assert seen == [("sparkeos-onstart-out", "http://minio:9000")]
