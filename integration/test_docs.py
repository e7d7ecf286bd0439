"""Every Python code block of the README and docs/ runs (against the real services,
placeholders pointed at this test's own; in this process's warm Spark session, or in a
process of its own when it makes its own session); so does the code a ``diff`` block
leaves after the change (its context and ``+`` lines)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from integration.doc_block import run_block_warm
from sparkeos.testing.job import run_spec_process, run_warm

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
DIFF = re.compile(r"```diff\n(.*?)```", re.S)


def after_change(diff: str) -> str:
    """The code a diff block shows after the change: context and ``+`` lines."""
    return "".join(line[1:] for line in diff.splitlines(keepends=True)
                   if not line.startswith("-"))


def blocks() -> list[Any]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for index, code in enumerate(BLOCK.findall(text)):
            name = f"{path.relative_to(REPO)}#{index + 1}"
            found.append(pytest.param(path.relative_to(REPO), code, id=name))
        for index, diff in enumerate(DIFF.findall(text)):
            name = f"{path.relative_to(REPO)}#diff{index + 1}"
            found.append(pytest.param(path.relative_to(REPO), after_change(diff), id=name))
    return found


def test_every_doc_with_code_is_covered() -> None:
    covered = {str(p.values[0]) for p in blocks()}
    assert {"README.md", "docs/writing-a-connector.md", "docs/helpers.md",
            "docs/connectors/postgres.md", "docs/connectors/kafka.md",
            "docs/connectors/sql.md", "docs/connectors/stomp.md"} <= covered


@pytest.mark.parametrize("source,code", blocks())
def test_doc_block_runs(source: Path, code: str, tmp_path: Any,
                        request: pytest.FixtureRequest) -> None:
    tag = uuid.uuid4().hex[:8]
    replace = {"sc://spark-connect:15002": "local[2]",  # a local Connect server
               "/data/incoming": f"{tmp_path}/input",
               "/data/": f"{tmp_path}/data/", "/checkpoints/": f"{tmp_path}/checkpoints/",
               "/shared/": f"{tmp_path}/shared/", '"orders"': f'"orders_{tag}"',
               '"orders-enriched"': f'"orders_enriched_{tag}"',
               '"wordcount"': f'"wordcount_{tag}"'}
    for directory in ("data", "checkpoints", "shared", "input"):
        (tmp_path / directory).mkdir()
    input_dir = tmp_path / "input"
    (input_dir / "part-0.json").write_text(
        "".join(json.dumps({"order_id": i, "payload": f"p{i}"}) + "\n" for i in range(5)))
    if "broker:9092" in code:
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        replace["broker:9092"] = bootstrap
        _produce_orders(bootstrap, f"orders_{tag}")
    if "stomp://app:secret@broker:61613" in code:
        from integration.stomp_helpers import send

        url = request.getfixturevalue("artemis_url")
        replace["stomp://app:secret@broker:61613"] = url
        send(url, f"orders_{tag}",
             [json.dumps({"order_id": i, "payload": f"p{i}"}) for i in range(5)])
    if "postgresql://app@db:5432/shop" in code:
        dsn = request.getfixturevalue("pg_server").dsn
        replace["postgresql://app@db:5432/shop"] = dsn
        _create_orders_table(dsn, f"orders_{tag}")
    s3_prefix = None
    if "s3a://lake/" in code:  # the table on the local S3 server (the checkpoint stays local)
        s3 = request.getfixturevalue("s3")
        s3_prefix = s3.fresh_dir(f"doc-{tag}")
        replace["s3a://lake/"] = f"{s3_prefix}/"
    spec = {"code": code, "replace": replace, "source": str(source),
            "input": str(input_dir), "workdir": str(tmp_path),
            "env": {"SPARKEOS_KAFKA_STAGING_DIR": str(tmp_path / "staging")}}
    # A block that makes its own session (other settings, Spark Connect) gets a process
    # of its own; the others run in this process's warm session (nothing kills them).
    own_session = re.search(r"SparkSession|local_session\(|connect_session\(", code)
    try:
        if own_session:
            result = run_spec_process("integration.doc_block", spec,
                                      str(tmp_path / "block.json"), cwd=str(REPO), timeout=600)
            assert result.returncode == 0 and "doc block ok" in result.stdout, \
                result.tail(60)
        else:
            result = run_warm(lambda _spark: run_block_warm(spec))
            assert result.returncode == 0, result.tail(60)
    finally:
        if s3_prefix is not None:
            request.getfixturevalue("s3").delete(s3_prefix)
        if "broker:9092" in replace:
            _delete_topics(replace["broker:9092"], [f"orders_{tag}", f"orders_enriched_{tag}"])
        if "postgresql://app@db:5432/shop" in replace:
            for table in (f"orders_{tag}", f"wordcount_{tag}"):
                _drop_table(replace["postgresql://app@db:5432/shop"], table)


def _produce_orders(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    from integration.connectors.kafka.conftest import create_topic

    create_topic(bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(5):
        producer.produce(topic, value=f"p{i}".encode(), key=str(i).encode())
    producer.flush(30)


def _delete_topics(bootstrap: str, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=30).topics)
    doomed = [t for t in topics if t in existing]
    for future in (admin.delete_topics(doomed, operation_timeout=30) if doomed else {}).values():
        future.result()


def _drop_table(dsn: str, table: str) -> None:
    import psycopg2

    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute("SET lock_timeout = '20s'")
        cur.execute(f'DROP TABLE IF EXISTS "{table}"')
    conn.close()


def _create_orders_table(dsn: str, table: str) -> None:
    import psycopg2

    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f'CREATE TABLE "{table}" (order_id bigint PRIMARY KEY, payload text)')
    conn.close()

