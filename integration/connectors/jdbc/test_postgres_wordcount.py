"""The most common streaming job, exactly once: a running word count (update mode)
upserted into PostgreSQL, with the driver killed at a different protocol point in
each of several runs."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import pytest

from integration.connectors.jdbc.support import Names, PgServer
from sparkeos.testing.job import run_spec_process

pytestmark = [pytest.mark.spark, pytest.mark.chaos]

FILES = [["a", "b", "a"], ["b", "c"], ["a", "d", "d"], ["e"], ["c", "c", "b"], ["a", "e"]]
# One crash per run, each in a later batch, each at another point of the protocol.
CRASHES = ["after_first_commit@1", "kill_driver_after_first_prepare@2"]
"""Upserts replayed among the commits (some of the batch's counts applied, some not),
and a phase 1 aborted (the other points are the protocol's: the in-process crash matrix
of the upsert mode runs every point)."""


def write_files(directory: str) -> None:
    os.makedirs(directory)
    for index, words in enumerate(FILES):
        path = os.path.join(directory, f"words-{index:03d}.json")
        with open(path + ".tmp", "w") as fh:
            fh.writelines(json.dumps({"word": w}) + "\n" for w in words)
        os.replace(path + ".tmp", path)


def test_word_count_upserts_exact_counts_under_repeated_driver_kills(
        tmp_path: Any, pg_server: PgServer, names: Names, admin: Any) -> None:
    write_files(str(tmp_path / "in"))
    spec = {"input": str(tmp_path / "in"), "checkpoint": str(tmp_path / "ckpt"),
            "dsn": pg_server.dsn, "table": names.table, "marker": names.marker}
    spec_path = str(tmp_path / "spec.json")
    for fault in CRASHES:
        result = run_spec_process("integration.connectors.jdbc.wordcount_job", spec,
                                  spec_path, fault, ahead_settings={})
        assert result.crashed, f"{fault}: the driver was not killed\n{result.tail()}"
    result = run_spec_process("integration.connectors.jdbc.wordcount_job", spec, spec_path,
                              ahead_settings={})
    assert result.returncode == 0, result.tail()

    expected = Counter(w for words in FILES for w in words)
    with admin.cursor() as cur:
        cur.execute(f'SELECT word, count FROM "{names.table}"')
        assert dict(cur.fetchall()) == dict(expected)
        # Every (batch, partition) applied by exactly one transaction, every batch once.
        cur.execute(f'SELECT batch_id, "partition", count(*) FROM "{names.marker}"'
                    ' GROUP BY 1, 2 ORDER BY 1, 2')
        markers = cur.fetchall()
    # Every batch Spark committed, and only those, has its markers. There may be fewer
    # batches than files: a driver killed while Spark plans batch N+1 (here beside batch
    # N's overlapped commit) after the file source logged its entry and before the offset
    # log did reads both entries' files as one batch after the restart (Spark's own
    # behaviour, with any writer).
    committed = sorted(int(n) for n in os.listdir(tmp_path / "ckpt" / "commits") if n.isdigit())
    assert committed == list(range(len(committed))) and len(committed) <= len(FILES), committed
    assert sorted({b for b, _p, _n in markers}) == committed  # each batch has words
    assert all(n == 1 for _b, _p, n in markers), markers
