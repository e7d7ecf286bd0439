"""Issue 15, defect 9: no secret in any repr, log line, error, commit-log file or CLI
output. Every sink that takes a secret is built with a canary and driven through a
batch (or a failure) with sparkeos' logs at DEBUG; the canary must appear nowhere."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest

from sparkeos.cli import main as cli
from sparkeos.core.config import CoordinatorConfig
from sparkeos.core.errors import SparkEOSError
from sparkeos.core.protocol import TransactionalSink
from sparkeos.core.snapshot.commitlog import CommitLog, sink_log_location
from sparkeos.core.snapshot.coordinator import Coordinator
from sparkeos.core.storage.logstores import LocalStore
from sparkeos.core.streaming.adapter import ForeachBatchAdapter
from sparkeos.testing.inprocess import ListRunner

CANARY = "canary-s3cret-7f41"


def _everything_written(root: str) -> str:
    text = []
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as fh:
                text.append(fh.read().decode(errors="replace"))
    return "\n".join(text)


def _drive(sink: TransactionalSink[Any], tmp_path: Any, caplog: pytest.LogCaptureFixture,
           capsys: pytest.CaptureFixture[str]) -> str:
    """A batch through the adapter's log claim and the coordinator, then `status`;
    returns everything that was printed, logged, raised or written to the log."""
    caplog.set_level(logging.DEBUG, logger="sparkeos")
    ckpt = str(tmp_path / "ckpt")
    config = CoordinatorConfig(name="canary")
    log = CommitLog(LocalStore(sink_log_location(ckpt, "canary")))
    seen = [repr(sink), str(sink.describe()), str(sink.identity())]
    try:
        key = ForeachBatchAdapter(sink, config)._claim_log(log, "query-canary")
        Coordinator(sink, config, log, key).run_batch(0, ListRunner([[1, 2], [3]]))
    except SparkEOSError as exc:
        seen.append(str(exc))
    finally:
        sink.close()
    cli(["status", ckpt, "--probe"])
    cli(["status", ckpt, "--json"])
    captured = capsys.readouterr()
    seen += [captured.out, captured.err, caplog.text, _everything_written(ckpt)]
    return "\n".join(seen)


def test_postgres_sink_never_shows_its_password(pg_server: Any, names: Any, tmp_path: Any,
                                                caplog: pytest.LogCaptureFixture,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    from sparkeos.connectors.jdbc import PostgresSink
    from sparkeos.connectors.jdbc.dsn import parse

    params = {**parse(pg_server.dsn), "password": CANARY}
    dsn = " ".join(f"{k}={v}" for k, v in params.items())
    sink = PostgresSink(dsn=dsn, table=names.table, marker_table=names.marker,
                        create_table=True)
    assert CANARY not in _drive(sink, tmp_path, caplog, capsys)
    unreachable = PostgresSink(dsn=f"postgresql://app:{CANARY}@127.0.0.1:1/db", table="t",
                               connect_timeout_s=2)
    assert CANARY not in _drive(unreachable, tmp_path / "down", caplog, capsys)


def test_kafka_sink_never_shows_producer_secrets(kafka_bootstrap: str, tmp_path: Any,
                                                 caplog: pytest.LogCaptureFixture,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from integration.fixtures.kafka import create_topic, unique_name
    from sparkeos.connectors.kafka import KafkaSink

    topic = unique_name(str(tmp_path))
    create_topic(kafka_bootstrap, topic)
    secrets = {"sasl.username": "svc", "sasl.password": CANARY,
               "ssl.key.password": CANARY}
    sink = KafkaSink(kafka_bootstrap, topic=topic, staging_dir=str(tmp_path / "staging"),
                     producer_config=secrets)
    assert CANARY not in _drive(sink, tmp_path, caplog, capsys)
    unreachable = KafkaSink("127.0.0.1:1", topic="t", staging_dir=str(tmp_path / "s2"),
                            timeout_s=2, producer_config={**secrets,
                                                          "security.protocol": "SASL_PLAINTEXT",
                                                          "sasl.mechanism": "PLAIN"})
    assert CANARY not in _drive(unreachable, tmp_path / "down", caplog, capsys)


def test_sql_sink_never_shows_its_url(tmp_path: Any, caplog: pytest.LogCaptureFixture,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from sparkeos.connectors.sql import SqlTableSink

    # A server URL carries the password; the server is unreachable here.
    unreachable = SqlTableSink(url=f"postgresql+psycopg2://app:{CANARY}@127.0.0.1:1/db", table="t")
    assert CANARY not in _drive(unreachable, tmp_path, caplog, capsys)


@pytest.mark.s3
def test_file_sink_on_an_object_store_never_shows_its_credentials(
        s3: Any, tmp_path: Any, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkeos.connectors.file import FileSink
    from sparkeos.core.storage.stores import s3 as objectstore

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY)  # the local store takes any
    monkeypatch.setattr(objectstore, "_clients", {})  # a client made with the canary
    out = s3.fresh_dir("secrets") + "/out"
    try:
        assert CANARY not in _drive(FileSink(out), tmp_path, caplog, capsys)
    finally:
        s3.delete(out)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")  # unreachable
    assert CANARY not in _drive(FileSink("s3a://bucket/out"), tmp_path / "down", caplog,
                                capsys)
