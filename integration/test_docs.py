"""Every Python code block of the README and docs/ runs (each in its own process,
against the real services, placeholders pointed at this test's own)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from sparkeos.testing.job import run_spec_process

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def blocks() -> list[Any]:
    found = []
    for path in DOCS:
        for index, code in enumerate(BLOCK.findall(path.read_text())):
            name = f"{path.relative_to(REPO)}#{index + 1}"
            found.append(pytest.param(path.relative_to(REPO), code, id=name))
    return found


def test_every_doc_with_code_is_covered():
    covered = {str(p.values[0]) for p in blocks()}
    assert {"README.md", "docs/writing-a-connector.md", "docs/helpers.md",
            "docs/connectors/postgres.md", "docs/connectors/kafka.md",
            "docs/connectors/sql.md", "docs/connectors/stomp.md"} <= covered


@pytest.mark.parametrize("source,code", blocks())
def test_doc_block_runs(source: Path, code: str, tmp_path: Any,
                        request: pytest.FixtureRequest) -> None:
    tag = uuid.uuid4().hex[:8]
    replace = {"/data/": f"{tmp_path}/data/", "/checkpoints/": f"{tmp_path}/checkpoints/",
               "/shared/": f"{tmp_path}/shared/", '"orders"': f'"orders_{tag}"',
               '"orders-enriched"': f'"orders_enriched_{tag}"'}
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
    spec = {"code": code, "replace": replace, "source": str(source),
            "input": str(input_dir), "workdir": str(tmp_path)}
    result = run_spec_process("integration.doc_block", spec, str(tmp_path / "block.json"),
                              cwd=str(REPO), timeout=600)
    assert result.returncode == 0 and "doc block ok" in result.stdout, result.tail(60)


def _produce_orders(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    from integration.connectors.kafka.conftest import create_topic

    create_topic(bootstrap, topic, partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(5):
        producer.produce(topic, value=f"p{i}".encode(), key=str(i).encode())
    producer.flush(30)


def _create_orders_table(dsn: str, table: str) -> None:
    import psycopg2

    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(f'CREATE TABLE "{table}" (order_id bigint PRIMARY KEY, payload text)')
    conn.close()

