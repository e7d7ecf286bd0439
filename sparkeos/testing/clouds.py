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
    """Start (or find) the service; the value of the ``<service>=...`` line it prints."""
    line = _script(service, "start")
    if not line.startswith(f"{service}="):
        raise ConfigurationError(f"docker/services/{service}.sh start printed {line!r}",
                                 fix=f"see the script's log under .services/{service}/")
    return line.split("=", 1)[1]


def make_gcs_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` on the GCS emulator at ``endpoint`` unless it exists."""
    from google.api_core.exceptions import Conflict
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="sparkeos",
                            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                            client_options={"api_endpoint": endpoint})
    with contextlib.suppress(Conflict):
        client.create_bucket(bucket)


def make_azure_container(connection: str, container: str) -> str:
    """Create ``container`` in the account of ``connection`` unless it exists; the
    account's name."""
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob import BlobServiceClient

    account = re.search(r"AccountName=([^;]+)", connection)
    if account is None:
        raise ConfigurationError("the Azure connection string names no AccountName",
                                 fix="give AccountName=... in it")
    with contextlib.suppress(ResourceExistsError):
        BlobServiceClient.from_connection_string(connection).create_container(container)
    return account.group(1)


def start_local_gcs(bucket: str) -> str:
    """Start (or find) fake-gcs-server, set ``STORAGE_EMULATOR_HOST``, make ``bucket``;
    the bucket's URI."""
    endpoint = _start("gcs")
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    make_gcs_bucket(endpoint, bucket)
    return f"gs://{bucket}"


def start_local_azure(container: str) -> str:
    """Start (or find) Azurite, set ``AZURE_STORAGE_CONNECTION_STRING``, make
    ``container``; its URI (``abfs://<container>@devstoreaccount1.dfs.core.windows.net``)."""
    connection = _start("azure")
    os.environ["AZURE_STORAGE_CONNECTION_STRING"] = connection
    account = make_azure_container(connection, container)
    return f"abfs://{container}@{account}.dfs.core.windows.net"


__all__ = ["gcs_spark_conf", "make_azure_container", "make_gcs_bucket", "start_local_azure",
           "start_local_gcs"]
