"""``core.streaming.identity``: a query is Spark's query ID wherever a route can read it, and a
query without one never shares a key with another (no fallback name)."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import pytest

from sparkeos.connectors.file import read_output
from sparkeos.connectors.file.format import ParquetFormat
from sparkeos.core.errors import CommitLogError, ConfigurationError
from sparkeos.core.snapshot.recovery import Recovery
from sparkeos.core.snapshot.txpool import query_key_for
from sparkeos.core.streaming import identity
from sparkeos.core.streaming.formatbatch import BATCH_ID_PROPERTY, FormatQuery, run_task
from sparkeos.core.streaming.spark import QUERY_ID_PROPERTY
from sparkeos.testing.inprocess import ID_SCHEMA, id_batch

FIRST = "3f0e2d1c-0000-4000-8000-00000000000a"
SECOND = "3f0e2d1c-0000-4000-8000-00000000000b"


def checkpoint_of(root: Any, query_id: str, batch: int | None = None) -> str:
    os.makedirs(root / "offsets", exist_ok=True)
    (root / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    if batch is not None:
        (root / "offsets" / str(batch)).write_text("v1\n{}\n")
    return str(root)


def test_the_running_query_then_the_checkpoint_then_nothing(tmp_path: Any) -> None:
    given = checkpoint_of(tmp_path / "ckpt", FIRST)
    running = identity.of_foreach_batch(SECOND, given)
    assert (running.query_id, running.found) == (SECOND, identity.RUNNING_QUERY)
    connect = identity.of_foreach_batch(None, given)
    assert connect.query_id == FIRST and connect.found.endswith("/metadata")
    assert connect.key == query_key_for(FIRST) and connect.durable
    unknown = identity.of_foreach_batch(None, None)
    assert not unknown.durable and "no checkpoint_location" in unknown.found
    with pytest.raises(ConfigurationError, match="exactly-once needs the query's identity"):
        unknown.require("orders")
    assert identity.of_checkpoint(str(tmp_path / "missing")).query_id is None


def test_no_identity_is_never_shared() -> None:
    """Two queries without a durable identity get two keys (no fallback name), and
    their pools tell the replay rule nothing is theirs."""
    first, second = identity.QueryIdentity.unknown("a"), identity.QueryIdentity.unknown("b")
    assert first.key != second.key
    assert not first.pool("orders").transaction(0, 0, 1_000_000, 0).durable_identity
    assert identity.of_task(FIRST).pool("orders").transaction(0, 0, 0, 0).durable_identity


def test_two_durable_identities_that_differ_fail_closed() -> None:
    planned = identity.QueryIdentity(FIRST, "the option's checkpoint")
    assert planned.agrees_with(identity.of_task(FIRST)) is planned
    assert identity.QueryIdentity.unknown("x").agrees_with(identity.of_task(SECOND)
                                                           ).query_id == SECOND
    with pytest.raises(CommitLogError, match="not the running query's"):
        planned.agrees_with(identity.of_task(SECOND))


def _format(out: str, **options: str) -> FormatQuery:
    fmt = ParquetFormat(options={"path": out, "sparkeos.name": "files",
                                 "sparkeos.guarantee": "at_least_once", **options})
    sink, settings = fmt._sink_and_settings(ID_SCHEMA)
    return FormatQuery(sink, settings.config, settings.max_partitions)


def _task(query: FormatQuery, query_id: str, batch: int, partition: int,
          ids: list[int]) -> dict[str, Any]:
    planned = query.plan(ID_SCHEMA)
    props = {BATCH_ID_PROPERTY: str(batch), QUERY_ID_PROPERTY: query_id}
    return run_task(planned, partition, 0, f"t{partition}", iter([id_batch(ids)]),
                    props.get)


def test_a_format_without_the_checkpoint_option_takes_the_tasks_query(tmp_path: Any
                                                                      ) -> None:
    """The checkpoint only in the session: the planning has no identity, each task
    takes the running query's; two queries' batch 0 are two writes."""
    out = str(tmp_path / "out")
    for query_id, ids in ((FIRST, [1, 2]), (SECOND, [3])):
        _task(_format(out), query_id, 0, 0, ids)
    names = sorted(n for n in os.listdir(out) if n.startswith("part-"))
    assert {n.split("-")[1] for n in names} == {query_key_for(FIRST), query_key_for(SECOND)}
    assert Counter(read_output(out, "parquet").column("id").to_pylist()) == Counter([1, 2, 3])


def test_a_task_of_another_query_than_the_option_s_checkpoint_refuses(tmp_path: Any
                                                                      ) -> None:
    checkpoint = checkpoint_of(tmp_path / "ckpt", FIRST, batch=0)
    query = _format(str(tmp_path / "out"), checkpointLocation=checkpoint)
    with pytest.raises(CommitLogError, match="not the running query's"):
        _task(query, SECOND, 0, 0, [1])


def test_a_batch_planned_again_in_a_reused_worker_is_swept_again(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restarted at-least-once query, planned in a Python worker Spark reuses, plans
    its last batch again: what the killed run's tasks left under it is swept again;
    a batch planned for the first time after the one before is not."""
    swept: list[int] = []
    monkeypatch.setattr(Recovery, "sweep_direct",
                        lambda self, batch, partitions: swept.append(batch))
    root = tmp_path / "ckpt"
    checkpoint = checkpoint_of(root, FIRST, batch=3)
    out = str(tmp_path / "out")
    _format(out, checkpointLocation=checkpoint).plan(ID_SCHEMA)  # first in this worker
    (root / "offsets" / "4").write_text("v1\n{}\n")
    _format(out, checkpointLocation=checkpoint).plan(ID_SCHEMA)  # the next batch
    _format(out, checkpointLocation=checkpoint).plan(ID_SCHEMA)  # batch 4 again: restart
    assert swept == [3, 4]
