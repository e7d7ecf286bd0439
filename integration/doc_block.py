"""Runs one Python code block of the docs, as a user would paste it (test harness).

    python -m integration.doc_block spec.json

The spec gives the block's code, the text replacements that point its placeholder
hosts, paths and names at this test's own (``broker:9092`` -> the test broker, ...),
and what to feed ``orders`` with. The block runs with ``orders`` (a streaming
DataFrame of order_id / payload rows) defined unless it defines it itself; a
``query`` it starts is run until the input is consumed, then stopped, and its
failure fails the block; a function ``write(df, batch_id)`` it defines is called on a
batch; a ``TransactionalSink`` subclass it defines with a ``path`` field writes two
batches through the real coordinator. A block that makes no session of its own runs
in the test process's warm session (``run_block_warm``): the harness's
``local_session("doc-block")`` is that session then, as ``sparkeos.testing.job`` runs
a job nothing kills; a block with a session of its own (other settings, Spark Connect)
gets a process of its own.
"""

from __future__ import annotations

import json
import os
import sys
import types
from typing import Any


def main(argv: list[str]) -> int:
    with open(argv[0]) as fh:
        spec = json.load(fh)
    os.environ.update(spec["env"])
    run_block(spec)
    print("doc block ok")
    return 0


def run_block(spec: dict[str, Any]) -> None:
    """Run the block ``spec`` holds (its environment already set): whatever it starts
    is stopped before this returns, also when it fails."""
    from pyspark.sql import SparkSession

    try:
        _run_block(spec)
    finally:
        active = SparkSession.getActiveSession()
        for query in active.streams.active if active is not None else ():
            query.stop()  # a block that failed may have left its query running


def run_block_warm(spec: dict[str, Any]) -> None:
    """``run_block`` in this process, its environment restored afterwards."""
    saved = {name: os.environ.get(name) for name in spec["env"]}
    os.environ.update(spec["env"])
    try:
        run_block(spec)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _run_block(spec: dict[str, Any]) -> None:
    code = spec["code"]
    for old, new in spec["replace"].items():
        code = code.replace(old, new)
    module = types.ModuleType("__doc_block__")  # dataclasses look their module up
    sys.modules[module.__name__] = module
    namespace: dict[str, Any] = module.__dict__
    if "orders =" not in code:
        from sparkeos.core.streaming.spark import local_session

        spark = local_session("doc-block")
        namespace["orders"] = (spark.readStream.schema("order_id long, payload string")
                               .json(spec["input"]))
    if "spark" in code and "spark =" not in code and "spark" not in namespace:
        from sparkeos.core.streaming.spark import local_session

        namespace["spark"] = local_session("doc-block")
    exec(compile(code, spec["source"], "exec"), namespace)
    query = namespace.get("query")
    if query is not None:
        query.processAllAvailable()
        query.stop()
        if query.exception() is not None:
            raise RuntimeError(f"the block's query failed: {query.exception()}")
    write = namespace.get("write")
    if callable(write):
        from sparkeos.core.streaming.spark import local_session

        spark = local_session("doc-block")
        write(spark.createDataFrame([(1, "a"), (2, "b")], "order_id long, payload string"), 0)
    _run_sinks(namespace, spec["workdir"])


def _run_sinks(namespace: dict[str, Any], workdir: str) -> None:
    import dataclasses

    from sparkeos.core import Coordinator, CoordinatorConfig, TransactionalSink
    from sparkeos.core.snapshot.commitlog import CommitLog
    from sparkeos.core.storage.logstores import LocalStore
    from sparkeos.testing.inprocess import ListRunner

    for value in list(namespace.values()):
        if (isinstance(value, type) and issubclass(value, TransactionalSink)
                and value.__module__ == "__doc_block__" and dataclasses.is_dataclass(value)
                and "path" in {f.name for f in dataclasses.fields(value)}):
            out = os.path.join(workdir, value.__name__)
            log = CommitLog(LocalStore(os.path.join(workdir, value.__name__ + "-log")))
            coord = Coordinator(value(path=out), CoordinatorConfig(name="doc"), log, "docq")
            coord.run_batch(0, ListRunner([[1, 2], [3]]))
            coord.run_batch(1, ListRunner([[4], []]))
            assert all(s.status == "finished" for s in coord.states().values())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
