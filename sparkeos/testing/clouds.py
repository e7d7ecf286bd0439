"""This checkout's local Google Cloud Storage and Azure Blob Storage emulators
(``docker/services/gcs.sh``: fake-gcs-server; ``docker/services/azure.sh``: Azurite),
for the demo and the benchmarks: start one, point this process and its children at it,
make the bucket or container.

pyspark ships no Hadoop connector for either. ``gcs_spark_conf`` gives Spark Google's
(gcs-connector, fetched from Maven Central by ``docker/services/gcs.sh spark-jars``),
pointed at the emulator, so the whole checkpoint can be on ``gs://``. Azurite has no
ADLS Gen2 (``dfs``) endpoint for ``abfs://``, and hadoop-azure's ``wasb://`` emulator
mode has its port fixed at 10000: a query on Azurite keeps Spark's checkpoint on a local
or shared path and gives ``exactly_once(..., checkpoint_location=<on the store>)``, so
sparkeos' commit log, staging and output are on the store (docs/connectors/file.md).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess

from sparkeos.core.errors import ConfigurationError

MIB = 1024 * 1024
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _script(service: str, command: str) -> str:
    script = os.path.join("docker", "services", f"{service}.sh")
    out = subprocess.run(["bash", script, command], cwd=_ROOT, capture_output=True,
                         text=True, timeout=900)
    if out.returncode != 0 or not out.stdout.strip():
        raise ConfigurationError(f"{script} {command} failed: {out.stderr.strip()[-800:]}",
                                 fix=f"see the script's log under .services/{service}/")
    return out.stdout.strip().splitlines()[-1]


def gcs_spark_conf(endpoint: str) -> dict[str, str]:
    """Session settings that give Spark Google's Cloud Storage connector, on the
    emulator at ``endpoint`` without credentials: Spark's checkpoint on ``gs://``."""
    return {
        "spark.jars": _script("gcs", "spark-jars"),
        "spark.hadoop.fs.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
        "spark.hadoop.fs.AbstractFileSystem.gs.impl":
            "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS",
        "spark.hadoop.fs.gs.storage.root.url": endpoint,
        "spark.hadoop.fs.gs.project.id": "sparkeos",
        "spark.hadoop.fs.gs.auth.type": "UNAUTHENTICATED",
        # Hadoop 3.5's core-default.xml gives sizes with units ("64m") for its own gs
        # connector, which Google's reads as plain numbers: in bytes here.
        **{f"spark.hadoop.fs.gs.{name}": str(size) for name, size in (
            ("block.size", 64 * MIB), ("rewrite.max.chunk.size", 512 * MIB),
            ("outputstream.buffer.size", 8 * MIB), ("inputstream.inplace.seek.limit", 8 * MIB),
            ("inputstream.min.range.request.size", 2 * MIB))},
    }


def _start(service: str) -> str:
    script = os.path.join("docker", "services", f"{service}.sh")
    out = subprocess.run(["bash", script, "start"], cwd=_ROOT, capture_output=True,
                         text=True, timeout=900)
    found = re.search(rf"^{service}=(\S+)", out.stdout, re.M)
    if out.returncode != 0 or not found:
        raise ConfigurationError(f"{script} start failed: {out.stderr.strip()[-800:]}",
                                 fix=f"see the script's log under .services/{service}/")
    return found.group(1)


def start_local_gcs(bucket: str) -> str:
    """Start (or find) fake-gcs-server, set ``STORAGE_EMULATOR_HOST``, make ``bucket``;
    the bucket's URI."""
    from google.api_core.exceptions import Conflict
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    endpoint = _start("gcs")
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    client = storage.Client(project="sparkeos",
                            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                            client_options={"api_endpoint": endpoint})
    with contextlib.suppress(Conflict):
        client.create_bucket(bucket)
    return f"gs://{bucket}"


def start_local_azure(container: str) -> str:
    """Start (or find) Azurite, set ``AZURE_STORAGE_CONNECTION_STRING``, make
    ``container``; its URI (``abfs://<container>@devstoreaccount1.dfs.core.windows.net``)."""
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob import BlobServiceClient

    connection = _start("azure")
    os.environ["AZURE_STORAGE_CONNECTION_STRING"] = connection
    account = re.search(r"AccountName=([^;]+)", connection)
    assert account, connection
    with contextlib.suppress(ResourceExistsError):
        BlobServiceClient.from_connection_string(connection).create_container(container)
    return f"abfs://{container}@{account.group(1)}.dfs.core.windows.net"


__all__ = ["gcs_spark_conf", "start_local_azure", "start_local_gcs"]
