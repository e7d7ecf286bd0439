"""sparkeos' pytest plugin: loaded automatically wherever sparkeos is installed
(entry point ``pytest11``), so a connector in another repository runs the conformance
suite with no ``pytest.ini``:

    pytest tests/test_my_sink.py                                  # everything
    pytest tests/test_my_sink.py -m "not chaos and not speculation"   # the fast subset

Markers it registers: ``spark`` (needs Java and pyspark), ``chaos`` (kills and
restarts Spark driver processes: slow), ``speculation`` (runs on a local Spark
standalone cluster), ``connect`` (through Spark Connect), ``hdfs`` (on a real HDFS),
``s3`` (on an S3-compatible object store), ``clouds`` (on the GCS and Azure Blob
emulators).
Fixture: ``spark_cluster``, the master URL of a standalone cluster
(a master and two workers on 127.0.0.2 / 127.0.0.3) started once per session and
stopped at the end if the session started it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

MARKERS = {
    "spark": "needs a local Spark (Java + pyspark)",
    "chaos": "slow fault-injection test (driver killed and restarted); "
             "deselect with -m 'not chaos'",
    "speculation": "runs on a local Spark standalone cluster with speculative task "
                   "attempts; deselect with -m 'not speculation'",
    "connect": "runs its Spark jobs through Spark Connect (a local Connect server per "
               "job); deselect with -m 'not connect'",
    "cluster": "runs its Spark jobs on a local Spark standalone cluster (a master and two "
               "workers); deselect with -m 'not cluster'",
    "hdfs": "puts checkpoints, commit logs and output on a real HDFS (NameNode and "
            "DataNode as local processes); deselect with -m 'not hdfs'",
    "s3": "puts checkpoints, commit logs, staging or output on an S3-compatible object "
          "store (docker/services/s3.sh, or $SPARKEOS_S3_ENDPOINT); deselect with "
          "-m 'not s3'",
    "clouds": "puts commit logs, staging or output on Google Cloud Storage and Azure Blob "
              "Storage emulators (docker/services/gcs.sh, azure.sh); deselect with "
              "-m 'not clouds'",
    "soak": "a long run compressed: hundreds to thousands of tiny batches with kills and task "
            "retries, checking that everything stays bounded (SPARKEOS_SOAK_BATCHES "
            "scales it); deselect with -m 'not soak'",
}


def pytest_configure(config: Any) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[str]:
    from sparkeos.testing import cluster

    config = cluster.ClusterConfig.default()
    was_running = cluster.status(config)
    master = cluster.start(config)
    yield master
    if not was_running:
        cluster.stop(config)
