"""The format route's three processes in this one, for in-process conformance cases.

``writeStream.format("sparkeos-...")`` runs a batch in three places Spark starts:
planning (``streamWriter()``), each task (``write()``) and the commit (``commit()`` /
``abort()``). ``FormatRoute.run_batch`` runs the same calls of ``core.streaming.formatbatch``
against a checkpoint laid out as Spark lays it out (its ``metadata`` and
``offsets/<N>``), with a batch runner's partitions as the tasks: what the route does
with a replay, a crash (faults with ``simulate=True``) or a failed task is then proven
against the connector's real destination without starting Spark.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sparkeos.core.config import Guarantee
from sparkeos.core.faults import FaultPlan, InjectedTaskFailure
from sparkeos.core.streaming.formatbatch import BATCH_ID_PROPERTY, FormatQuery, run_task
from sparkeos.core.streaming.spark import QUERY_ID_PROPERTY

from .inprocess import ArrowRunner

QUERY_ID = "5e0f0c1d-0000-4000-8000-0000000000f0"
Rows = Callable[[pa.RecordBatch], pa.RecordBatch]


class FormatRoute:
    """One sink of one query through its format: ``format_name`` with ``options`` (the
    connector's ``format_spec``), writing under ``guarantee``; ``rows`` turns the
    runner's rows into what the format's stream holds (a projection Spark would make)."""

    def __init__(self, format_name: str, options: dict[str, str], checkpoint: str,
                 name: str, guarantee: Guarantee, rows: Rows | None = None,
                 faults: FaultPlan | None = None, query_id: str = QUERY_ID,
                 checkpoint_option: bool = True) -> None:
        """``checkpoint_option`` False: the checkpoint is set as most jobs set it, in the
        session (``spark.sql.streaming.checkpointLocation``), so the format never sees
        it; ``query_id``: the ID Spark keeps in it and sets on every task."""
        from sparkeos.formats import format_classes

        found = [c for c in format_classes() if c.name() == format_name]
        if not found:
            raise ValueError(f"no sparkeos format named {format_name!r}")
        self.format_class = found[0]
        self.options = {**options, "sparkeos.name": name,
                        "sparkeos.guarantee": guarantee.value,
                        **({"checkpointLocation": checkpoint} if checkpoint_option else {})}
        self.checkpoint, self.name, self.guarantee = checkpoint, name, guarantee
        self.query_id = query_id
        self.rows: Rows = rows or (lambda batch: batch)
        self.faults = faults
        os.makedirs(os.path.join(checkpoint, "offsets"), exist_ok=True)
        metadata = os.path.join(checkpoint, "metadata")
        if not os.path.exists(metadata):
            with open(metadata, "w") as fh:
                fh.write(json.dumps({"id": query_id}) + "\n")

    def query(self, schema: pa.Schema) -> FormatQuery:
        """What one of Spark's processes builds from the options (as ``streamWriter``)."""
        fmt = self.format_class(options=self.options)
        sink, settings = fmt._sink_and_settings(schema)
        query = FormatQuery(sink, settings.config, settings.max_partitions)
        if self.faults is not None:
            query.faults = query.coordinator.scope.faults = self.faults
        return query

    def run_batch(self, batch_id: int, runner: ArrowRunner) -> Any:
        """Spark's calls for one batch: ``offsets/<N>``, the planning, a task per
        partition, retried up to ``runner.max_attempts`` (a task failing for good:
        ``abort``, and the failure propagates), the commit."""
        with open(os.path.join(self.checkpoint, "offsets", str(batch_id)), "w") as fh:
            fh.write("v1\n{}\n")
        data = [self.rows(batch) for batch in runner.data]
        schema = data[0].schema if data else self.rows(pa.RecordBatch.from_pylist(
            [], schema=runner.schema)).schema
        planned = self.query(schema).plan(schema)
        props = {BATCH_ID_PROPERTY: str(batch_id), QUERY_ID_PROPERTY: self.query_id}
        results: list[dict[str, Any] | None] = []
        for partition, batch in enumerate(data):
            for attempt in range(runner.max_attempts):  # Spark retries a failed task
                try:
                    if runner.before_attempt is not None:
                        runner.before_attempt(partition, attempt)
                    results.append(run_task(planned, partition, attempt,
                                            f"t{partition}a{attempt}",
                                            iter([batch] if batch.num_rows else []),
                                            props.get))
                    break
                except InjectedTaskFailure:
                    if attempt + 1 < runner.max_attempts:
                        continue
                    self.query(schema).abort(batch_id, [*results, None])
                    raise
        return self.query(schema).commit(batch_id, [r for r in results if r is not None],
                                         schema)

    def recover(self, schema: pa.Schema) -> None:
        """A restarted query's full recovery of the route's commit log (exactly-once),
        with the sink its options make."""
        query = self.query(schema)
        if query.log is not None:
            query.coordinator.recover(full=True)


__all__ = ["QUERY_ID", "FormatRoute"]
