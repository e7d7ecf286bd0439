"""Where a Delta table is, for sparkeos' own files and for delta-rs: one resolution of
the table's location (``core.storage.registry.split_uri``, made on the driver and
pickled with the sink) gives both, so the attempts' files and the log are always on the
same store at the same endpoint.

- **Local and mounted paths**: as before; delta-rs' log commits are ``link``-based
  (never overwrite).
- **S3** (``s3://``, ``s3a://``, ``s3n://``; Amazon S3, MinIO, R2, the project's local
  server): the data files are written by sparkeos' conditional creates
  (``core.storage.stores.s3``); delta-rs writes ``_delta_log/<version>.json`` with its
  own ``If-None-Match: *`` create, measured on deltalake 1.6 against the local server:
  two commits of one version, the second fails with ``CommitFailedError``. A store that
  ignores the precondition would let two commits of one version both "win": it is
  refused by the same probe as sparkeos' own writes (``TableFiles.check_writes``),
  before anything is written. delta-rs is given the endpoint and region the ``S3Files``
  resolved (the same settings Spark's S3A reads), and the credentials boto3's chain
  finds in the process that calls it (keys, a profile, a role), never kept in the sink.
- **Azure Blob Storage** (``abfs[s]://container@account.dfs.core.windows.net/...``,
  ``wasb[s]://``; Azurite here): the data files by sparkeos' ``If-None-Match: *``
  creates (``core.storage.stores.azure``); delta-rs commits the log by its own
  ``If-None-Match: *`` create, measured on deltalake 1.6 against Azurite as on S3 (the
  second commit of one version fails with ``CommitFailedError``). delta-rs is given the
  table as ``az://container/path`` (it knows no ``wasb``), the Blob endpoint sparkeos
  resolved (the connection string's ``BlobEndpoint``, else the account's), and the
  account key or SAS token of the process that calls it; without either, delta-rs'
  own chain (``AZURE_CLIENT_ID``..., a managed identity).
- **HDFS** (``hdfs://namenode:<rpc port>/...``): the data files by sparkeos through
  WebHDFS (``CREATE`` without overwrite, ``RENAME`` that never replaces,
  ``core.storage.stores.webhdfs``); delta-rs commits the log over HDFS's own RPC
  (hdfs-native, in the deltalake wheel), where a commit's create never replaces a file:
  measured on deltalake 1.6 against the project's HDFS 3.5, the second commit of one
  version fails with ``CommitFailedError``. delta-rs is given the ``hdfs://`` URI as it
  is (``webhdfs://`` names the HTTP port, not the RPC port delta-rs needs: refused with
  the fix). Both must act as one HDFS user: hdfs-native's (``HADOOP_USER_NAME``, else
  the user of the process's uid, in each process) is checked against sparkeos' WebHDFS
  user (the driver's) before every delta-rs call (``check_hdfs_user``).
  Kerberos is not supported (WebHDFS here sends ``user.name``, no SPNEGO).
- **Google Cloud Storage** is refused up front, with the fix.
"""

from __future__ import annotations

import os

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.storage.attempts import TableFiles
from sparkeos.core.storage.locations import local_path
from sparkeos.core.storage.registry import split_uri
from sparkeos.core.storage.stores.azure import AzureBlobFiles, shared_secret
from sparkeos.core.storage.stores.s3 import S3Files
from sparkeos.core.storage.stores.webhdfs import WebHdfsFiles


def table_files(path: str) -> TableFiles:
    """The table's directory at ``path`` (a local path, ``file:``, S3 or Azure URI)."""
    files, root = split_uri(path)
    if files.is_local:  # as the sink always read a local path (``~`` is a name here)
        return TableFiles(files, os.path.abspath(local_path(path)))
    if isinstance(files, WebHdfsFiles) and files.scheme != "hdfs":
        raise ConfigurationError(
            f"DeltaSink reaches HDFS through hdfs:// URIs, not {path} (delta-rs commits "
            "the log over the NameNode's RPC port, which a webhdfs:// URI does not name)",
            fix="write hdfs://namenode:<rpc port>/path, and SPARKEOS_WEBHDFS_PORT=<http "
            "port> where it is not 9870")
    if not isinstance(files, (S3Files, AzureBlobFiles, WebHdfsFiles)):
        raise ConfigurationError(
            f"DeltaSink writes tables on local paths, S3, Azure Blob Storage and HDFS so "
            f"far, not {path}",
            fix="write the table to a local or mounted path, to s3a://bucket/..., "
            "abfss://container@account.dfs.core.windows.net/... or hdfs://namenode:port/..."
            "; Google Cloud Storage comes next (issue 51)")
    return TableFiles(files, root)


def table_uri(where: TableFiles) -> str:
    """The table's location as delta-rs is given it: ``where.uri()``, but Azure's as
    ``az://container/path`` (delta-rs reads no ``wasb``; the account travels in the
    options)."""
    files = where.files
    if isinstance(files, AzureBlobFiles):
        return f"az://{files.container}{where.root}"
    return where.uri()


def storage_options(where: TableFiles) -> dict[str, str] | None:
    """delta-rs' ``storage_options`` for the table, without credentials (None: a local
    path or HDFS, which delta-rs reaches by the URI alone). On S3 the endpoint is given
    under both names delta-rs reads: it takes ``AWS_ENDPOINT_URL_S3`` from the
    environment over ``AWS_ENDPOINT_URL`` from the options (measured on deltalake 1.6),
    so an executor's environment could otherwise send the log elsewhere than the data
    files. Without an endpoint setting, Amazon S3's
    own for the region (not whatever ``AWS_ENDPOINT`` the environment holds)."""
    files = where.files
    if isinstance(files, AzureBlobFiles):
        # use_emulator off: set in an executor's environment it would make delta-rs'
        # client ignore the endpoint (object_store 0.13) and commit the log elsewhere
        options = {"azure_storage_account_name": files.account,
                   "azure_storage_endpoint": files.endpoint,
                   "azure_storage_use_emulator": "false"}
        if files.endpoint.startswith("http://"):
            options["azure_allow_http"] = "true"
        return options
    if isinstance(files, WebHdfsFiles):
        check_hdfs_user(files)
        return None
    if not isinstance(files, S3Files):
        return None
    endpoint = files.endpoint or f"https://s3.{files.region}.amazonaws.com"
    options = {"AWS_REGION": files.region, "AWS_ENDPOINT_URL": endpoint,
               "AWS_ENDPOINT_URL_S3": endpoint}
    if endpoint.startswith("http://"):
        options["AWS_ALLOW_HTTP"] = "true"
    return options


def check_hdfs_user(files: WebHdfsFiles) -> None:
    """Refuse to hand delta-rs an HDFS table as another user than sparkeos writes its
    files as: hdfs-native (0.13, simple authentication) takes ``HADOOP_USER_NAME`` when
    it is set (even empty), else the user of the process's uid; sparkeos' WebHDFS user
    is the driver's, carried with the sink. Two owners would leave the log and the data
    files each unwritable by the other where HDFS checks permissions."""
    import pwd

    named = os.environ.get("HADOOP_USER_NAME")
    native = named if named is not None else pwd.getpwuid(os.geteuid()).pw_name
    if native != files.user:
        raise ConfigurationError(
            f"delta-rs would reach HDFS as {native!r} in this process, sparkeos writes the "
            f"table's files at {files.uri('/')} as {files.user!r} (the driver's user)",
            fix=f"set HADOOP_USER_NAME={files.user} in the driver's and every executor's "
            "environment")


def table_identity(where: TableFiles) -> str:
    """The table as the commit log pins the sink's destination: one spelling per table
    where the store has several (Azure: ``abfs``, ``abfss``, ``wasb``, ``wasbs`` of one
    container, its account in any case; an HDFS host in any case, with Hadoop's default
RPC port 8020 where none is given). A local path and S3 as they always were."""
    files = where.files
    if isinstance(files, AzureBlobFiles):
        return f"azure://{files.account.lower()}/{files.container.lower()}{where.root}"
    if isinstance(files, WebHdfsFiles):
        authority = files.authority.lower()
        return f"hdfs://{authority if ':' in authority else authority + ':8020'}{where.root}"
    return where.uri()


def with_credentials(where: TableFiles, options: dict[str, str] | None
                     ) -> dict[str, str] | None:
    """``options`` with the credentials this process finds as sparkeos' own client does:
    on S3 boto3's chain (keys, a profile, a role; delta-rs reads the keys from the
    environment but not a profile), on Azure the account key or SAS token of
    ``AZURE_STORAGE_CONNECTION_STRING`` / ``AZURE_STORAGE_KEY`` / ``AZURE_STORAGE_SAS_TOKEN``
    (delta-rs reads none of them). Resolved per call, never kept in the sink."""
    if options is None:
        return None
    if isinstance(where.files, AzureBlobFiles):
        secret = shared_secret(where.files.account)
        if secret is None:
            return options
        kind, value = secret
        return {**options, ("azure_storage_account_key" if kind == "key"
                            else "azure_storage_sas_token"): value.lstrip("?")}
    import boto3

    found = boto3.session.Session().get_credentials()
    if found is None:
        return options
    frozen = found.get_frozen_credentials()
    extra = {"AWS_ACCESS_KEY_ID": frozen.access_key,
             "AWS_SECRET_ACCESS_KEY": frozen.secret_key}
    if frozen.token:
        extra["AWS_SESSION_TOKEN"] = frozen.token
    return {**options, **extra}


__all__ = ["check_hdfs_user", "storage_options", "table_files", "table_identity", "table_uri",
           "with_credentials"]
