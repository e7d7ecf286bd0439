"""In-process stand-ins for Spark and the checkpoint store, for fast protocol tests."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from sparkeos.core.commitlog import Store
from sparkeos.core.coordinator import TaskFunction, TaskResult
from sparkeos.core.faults import InjectedTaskFailure

ID_SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])
_RUNS = itertools.count()


def id_batch(ids: Sequence[int]) -> pa.RecordBatch:
    """Rows shaped like the job's input: ``id`` and ``payload``."""
    return pa.RecordBatch.from_pydict(
        {"id": pa.array(list(ids), pa.int64()),
         "payload": pa.array([f"row-{i}" for i in ids], pa.string())},
        schema=ID_SCHEMA,
    )


class ListRunner:
    """Runs tasks in-process over partitions given as lists of ids; retries like Spark."""

    def __init__(self, partitions: list[list[int]], max_attempts: int = 2) -> None:
        self.run = next(_RUNS)  # like Spark's application ID: unique per driver run
        self.data = partitions
        self.max_attempts = max_attempts
        self.schema = ID_SCHEMA

    def partitions(self) -> int:
        return len(self.data)

    def arrow_schema(self) -> pa.Schema:
        return self.schema

    def run_tasks(self, task: TaskFunction) -> list[TaskResult]:
        results = []
        for p, ids in enumerate(self.data):
            for attempt in range(self.max_attempts):
                batches: Iterator[pa.RecordBatch] = iter([id_batch(ids)] if ids else [])
                try:
                    results.append(task(p, attempt, f"r{self.run}-a{attempt}", batches))
                    break
                except InjectedTaskFailure:
                    if attempt + 1 == self.max_attempts:
                        raise
        return results

    def run_in_tasks(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        return [fn(item) for item in items]


class MemoryStore(Store):
    """A commit-log store in a dict (no durability: for simulated crashes only)."""

    def __init__(self) -> None:
        self.location = "memory://"
        self.files: dict[str, bytes] = {}

    def list_names(self) -> list[str]:
        return list(self.files)

    def read(self, name: str) -> bytes:
        return self.files[name]

    def write_new(self, name: str, data: bytes) -> None:
        if name in self.files:
            raise FileExistsError(name)
        self.files[name] = data

    def replace(self, name: str, data: bytes) -> None:
        self.files[name] = data

    def delete(self, name: str) -> None:
        self.files.pop(name, None)
