"""This checkout's local Google Cloud Storage and Azure Blob Storage emulators
(``docker/services/gcs.sh``: fake-gcs-server; ``docker/services/azure.sh``: Azurite),
for the demo and the benchmarks: start one, point this process and its children at it,
make the bucket or container.

Spark itself does not reach them (no gcs-connector or hadoop-azure in pyspark): a query
using them keeps Spark's checkpoint on a local or shared path and gives
``exactly_once(..., checkpoint_location=<on the store>)``, so sparkeos' commit log,
staging and output are on the store (docs/connectors/file.md).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess

from sparkeos.core.errors import ConfigurationError

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


__all__ = ["start_local_azure", "start_local_gcs"]
