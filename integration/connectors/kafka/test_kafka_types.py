"""Drop-in means the same records: one batch through Spark's kafka sink and through
``format("sparkeos-kafka")`` with the same options and columns gives the same key,
value and headers bytes, in the same order, on the same partitions (the Java client's
murmur2 for a key)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from sparkeos.connectors.kafka import read_topic
from sparkeos.testing.job import run_spec_process

from .conftest import create_topic, unique_name
from .layout_job import KEYED_ROWS, LAYOUT_ROWS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
KEYED_PARTITIONS = 4


def _records(bootstrap: str, topic: str) -> list[tuple[Any, ...]]:
    return [(m.partition(), m.key(), m.value(), m.headers())
            for m in read_topic(bootstrap, topic, open_transactions="fail")]


@pytest.mark.spark
def test_records_are_the_bytes_sparks_kafka_sink_writes(kafka_bootstrap: str,
                                                        tmp_path: Any) -> None:
    topics = {writer: {"layout": unique_name(str(tmp_path), f"layout-{writer}"),
                       "keyed": unique_name(str(tmp_path), f"keyed-{writer}")}
              for writer in ("spark", "ours")}
    for by_kind in topics.values():
        create_topic(kafka_bootstrap, by_kind["layout"], partitions=1)
        create_topic(kafka_bootstrap, by_kind["keyed"], partitions=KEYED_PARTITIONS)
    spec = {"bootstrap": kafka_bootstrap, "workdir": str(tmp_path),
            "name": unique_name(str(tmp_path), "types"), **topics}
    result = run_spec_process("integration.connectors.kafka.layout_job", spec,
                              str(tmp_path / "spec.json"), cwd=REPO)
    assert result.returncode == 0 and "layout job ok" in result.stdout, result.tail(60)
    theirs = _records(kafka_bootstrap, topics["spark"]["layout"])
    assert [r[1] for r in theirs] == [
        None if row[1] is None else row[1].encode() for row in LAYOUT_ROWS], \
        "Spark's sink wrote the rows in order"
    assert _records(kafka_bootstrap, topics["ours"]["layout"]) == theirs
    spark_keyed = sorted(_records(kafka_bootstrap, topics["spark"]["keyed"]),
                         key=lambda r: r[1])
    assert len(spark_keyed) == len(KEYED_ROWS)
    assert len({r[0] for r in spark_keyed}) > 1, "the keys spread over the partitions"
    assert sorted(_records(kafka_bootstrap, topics["ours"]["keyed"]),
                  key=lambda r: r[1]) == spark_keyed
