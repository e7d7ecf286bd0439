"""Where an Iceberg sink's tables are, for sparkeos' own files and for pyiceberg's
FileIO: the warehouse's store is resolved once, on the driver (``warehouse_store``), and
pyiceberg is told the same endpoint (``io_properties``), so the attempts' files and the
table's metadata always go to one store.

- **Local and mounted paths**: as before.
- **S3** (``s3://``, ``s3a://``, ``s3n://``): the endpoint and region of the settings
  Spark's S3A reads, unless the catalog's ``s3.endpoint`` / ``s3.region`` say otherwise
  (then those, for sparkeos' files too).
- **Google Cloud Storage** (``gs://``): the endpoint of ``STORAGE_EMULATOR_HOST`` /
  ``spark.hadoop.fs.gs.storage.root.url``, unless the catalog's ``gcs.service.host``
  says otherwise; pyiceberg's FileIO is ``fileio.SparkeosFileIO`` (it signs nothing for
  an emulator without credentials, as sparkeos' client).
- **Azure Blob Storage** (``abfs[s]://container@account.dfs.core.windows.net/...``,
  ``wasb[s]://``): the Blob endpoint of the connection string's account, else the
  account's own; pyiceberg is told the account, the endpoint's authority and scheme,
  and, in each process where it is opened (``io_credentials``, never kept in the
  sink), the account key or SAS token sparkeos' own client takes.
- **HDFS** is refused: pyiceberg reaches it only through Arrow's ``HadoopFileSystem``,
  which needs ``libhdfs`` and Hadoop's classpath in every process.

pyiceberg commits through the SQL catalog's database (a compare-and-swap of the
metadata's location), so its metadata writes need no conditional create; sparkeos' own
writes are ``core.storage.attempts.TableFiles``' (create-if-absent, probed in
``validate``).
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from collections.abc import Mapping

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.storage.files import AZURE_SCHEMES, GCS_SCHEMES, S3_SCHEMES, Files
from sparkeos.core.storage.locations import parse as parse_location
from sparkeos.core.storage.logstores import is_local_uri
from sparkeos.core.storage.registry import split_uri
from sparkeos.core.storage.stores.azure import AzureBlobFiles, shared_secret
from sparkeos.core.storage.stores.gcs import GcsFiles
from sparkeos.core.storage.stores.s3 import S3Files

FILE_IO = "sparkeos.connectors.iceberg.fileio.SparkeosFileIO"


def check_location(location: str, what: str) -> None:
    """Refuse a warehouse or table location on a store the sink does not write."""
    if is_local_uri(location):
        return
    scheme = parse_location(location).scheme
    if scheme in ("hdfs", "webhdfs", "viewfs"):
        raise ConfigurationError(
            f"IcebergSink cannot write tables on HDFS ({what}={location}): pyiceberg "
            "reaches HDFS only through Arrow's HadoopFileSystem, which needs libhdfs and "
            "Hadoop's classpath in every process",
            fix="put the warehouse on a local or mounted path, S3, Google Cloud Storage "
            "or Azure Blob Storage; or write a Delta table (DeltaSink takes hdfs://)")
    if scheme not in {*S3_SCHEMES, *GCS_SCHEMES, *AZURE_SCHEMES}:
        raise ConfigurationError(
            f"IcebergSink writes tables on local paths, S3, Google Cloud Storage and "
            f"Azure Blob Storage, not {what}={location}",
            fix="a local or mounted warehouse (file:///...), or s3a://bucket/..., "
            "gs://bucket/... or abfss://container@account.dfs.core.windows.net/...")


def warehouse_store(properties: Mapping[str, str]) -> Files | None:
    """The store of the warehouse (None for a local one), with the catalog's own
    endpoint settings where it gives them."""
    warehouse = properties.get("warehouse", "")
    if is_local_uri(warehouse):
        return None
    store, _ = split_uri(warehouse)
    if isinstance(store, S3Files):
        endpoint = properties.get("s3.endpoint")
        region = properties.get("s3.region") or properties.get("client.region")
        if endpoint:
            store = dataclasses.replace(store, endpoint=endpoint.rstrip("/"),
                                        endpoint_from="the catalog's s3.endpoint")
        if region:
            store = dataclasses.replace(store, region=region)
    elif isinstance(store, GcsFiles) and properties.get("gcs.service.host"):
        store = dataclasses.replace(store, endpoint=properties["gcs.service.host"].rstrip("/"),
                                    endpoint_from="the catalog's gcs.service.host")
    elif isinstance(store, AzureBlobFiles) and properties.get("adls.blob-storage-authority"):
        store = dataclasses.replace(store, endpoint=_azure_endpoint(store, properties),
                                    endpoint_from="the catalog's adls.blob-storage-authority")
    return store


def _azure_endpoint(store: AzureBlobFiles, properties: Mapping[str, str]) -> str:
    """The Blob endpoint Arrow builds from the catalog's authority: ``.blob.<suffix>``
    (a leading dot) after the account, else an emulator's ``host:port/<account>``."""
    scheme = properties.get("adls.blob-storage-scheme", "https")
    authority = properties["adls.blob-storage-authority"]
    if authority.startswith("."):
        return f"{scheme}://{store.account}{authority}"
    return f"{scheme}://{authority}/{store.account}"


def io_properties(properties: Mapping[str, str], store: Files | None) -> dict[str, str]:
    """What pyiceberg's FileIO is told beyond the catalog's properties (nothing secret:
    this travels with the sink)."""
    found: dict[str, str] = {}
    if isinstance(store, S3Files):
        if store.endpoint and "s3.endpoint" not in properties:
            found["s3.endpoint"] = store.endpoint
        region_set = store.endpoint or os.environ.get("AWS_REGION") \
            or os.environ.get("AWS_DEFAULT_REGION")
        if region_set and not {"s3.region", "client.region"} & set(properties):
            found["s3.region"] = store.region  # else pyiceberg finds the bucket's region
        return found
    if isinstance(store, GcsFiles):
        if store.endpoint and "gcs.service.host" not in properties:
            found["gcs.service.host"] = store.endpoint
    elif isinstance(store, AzureBlobFiles):
        url = urllib.parse.urlsplit(store.endpoint)
        emulated = url.path.strip("/") == store.account  # Azurite: host:port/<account>
        netloc = url.netloc.lower()  # a host has no case; Arrow's prefix is the account's
        blob = netloc if emulated else netloc.removeprefix(store.account.lower())
        dfs = blob if emulated else blob.replace(".blob.", ".dfs.", 1)
        arrow_endpoint = _azure_endpoint(store, {"adls.blob-storage-authority": blob,
                                                 "adls.blob-storage-scheme": url.scheme})
        if "py-io-impl" not in properties \
                and _spelled(arrow_endpoint) != _spelled(store.endpoint):
            # a custom domain, which Arrow's client (sparkeos' FileIO) cannot spell
            raise ConfigurationError(
                f"pyiceberg's Azure client cannot reach the Blob endpoint {store.endpoint} "
                f"of account {store.account}: it builds <account><authority> or "
                f"<authority>/<account>, which gives {arrow_endpoint}",
                fix="give the account's own endpoint (https://<account>.blob.core.windows"
                ".net, or an emulator's http://host:port/<account>) in "
                "AZURE_STORAGE_CONNECTION_STRING's BlobEndpoint")
        found.update({"adls.account-name": store.account,
                      "adls.blob-storage-authority": blob, "adls.dfs-storage-authority": dfs,
                      "adls.blob-storage-scheme": url.scheme,
                      "adls.dfs-storage-scheme": url.scheme})
        found = {k: v for k, v in found.items() if k not in properties}
    else:
        return found
    if "py-io-impl" not in properties:
        found["py-io-impl"] = FILE_IO
    return found


def _spelled(endpoint: str) -> str:
    """An endpoint as it is compared: scheme and host in lower case, no trailing
    slash."""
    url = urllib.parse.urlsplit(endpoint.rstrip("/"))
    return urllib.parse.urlunsplit(url._replace(scheme=url.scheme.lower(),
                                                netloc=url.netloc.lower()))


def check_table_location(store: Files | None, location: str, what: str) -> None:
    """Refuse an Azure table outside the warehouse's container: pyiceberg's Azure client
    serves one account (``adls.account-name``), whatever the location names, so its
    metadata would go to the warehouse's account while sparkeos' files went to the
    other. ``abfs``, ``abfss``, ``wasb`` and ``wasbs`` of the container are all in it.
    The store's kind is ``check_location``'s (``catalog.check_table``), asked first."""
    if not isinstance(store, AzureBlobFiles):
        return
    found, _ = split_uri(location)
    if not isinstance(found, AzureBlobFiles) or (
            found.account.lower(), found.container) != (store.account.lower(),
                                                        store.container):
        raise ConfigurationError(
            f"{what}={location} is not in the warehouse's container "
            f"{store.uri('/')}: IcebergSink writes Azure tables there only",
            fix="give the table a location in the warehouse's container, or write it "
            "through a catalog whose warehouse is there")


def io_credentials(properties: Mapping[str, str], store: Files | None) -> dict[str, str]:
    """The secrets pyiceberg needs beyond the catalog's properties, found in this
    process as sparkeos' own client finds them (Azure: the account key or SAS token of
    ``AZURE_STORAGE_CONNECTION_STRING`` / ``AZURE_STORAGE_KEY`` /
    ``AZURE_STORAGE_SAS_TOKEN``), never kept in the sink. Without any, Arrow's own
    chain (Azure AD)."""
    if not isinstance(store, AzureBlobFiles) \
            or {"adls.account-key", "adls.sas-token"} & set(properties):
        return {}
    secret = shared_secret(store.account)
    if secret is None:
        return {}
    kind, value = secret
    return {"adls.account-key": value} if kind == "key" \
        else {"adls.sas-token": value.lstrip("?")}


__all__ = ["FILE_IO", "check_location", "check_table_location", "io_credentials", "io_properties",
           "warehouse_store"]
