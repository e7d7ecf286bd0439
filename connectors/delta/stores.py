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
- **Google Cloud Storage, Azure and HDFS** are refused up front, with the fix.
"""

from __future__ import annotations

import os

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.storage.attempts import TableFiles
from sparkeos.core.storage.locations import local_path
from sparkeos.core.storage.registry import split_uri
from sparkeos.core.storage.stores.s3 import S3Files


def table_files(path: str) -> TableFiles:
    """The table's directory at ``path`` (a local path, ``file:`` or S3 URI)."""
    files, root = split_uri(path)
    if files.is_local:  # as the sink always read a local path (``~`` is a name here)
        return TableFiles(files, os.path.abspath(local_path(path)))
    if not isinstance(files, S3Files):
        raise ConfigurationError(
            f"DeltaSink writes tables on local paths and S3 so far, not {path}",
            fix="write the table to a local or mounted path or to s3a://bucket/...; "
            "Google Cloud Storage, Azure and HDFS come next (issue 51)")
    return TableFiles(files, root)


def storage_options(where: TableFiles) -> dict[str, str] | None:
    """delta-rs' ``storage_options`` for the table, without credentials (None: a local
    path). The endpoint is given under both names delta-rs reads: it takes
    ``AWS_ENDPOINT_URL_S3`` from the environment over ``AWS_ENDPOINT_URL`` from the
    options (measured on deltalake 1.6), so an executor's environment could otherwise
    send the log elsewhere than the data files. Without an endpoint setting, Amazon S3's
    own for the region (not whatever ``AWS_ENDPOINT`` the environment holds)."""
    files = where.files
    if not isinstance(files, S3Files):
        return None
    endpoint = files.endpoint or f"https://s3.{files.region}.amazonaws.com"
    options = {"AWS_REGION": files.region, "AWS_ENDPOINT_URL": endpoint,
               "AWS_ENDPOINT_URL_S3": endpoint}
    if endpoint.startswith("http://"):
        options["AWS_ALLOW_HTTP"] = "true"
    return options


def with_credentials(options: dict[str, str] | None) -> dict[str, str] | None:
    """``options`` with the credentials boto3's chain finds in this process (keys, a
    profile, a role), as sparkeos' own S3 client uses them: delta-rs reads the keys from
    the environment but not a profile. Resolved per call, never kept in the sink."""
    if options is None:
        return None
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


__all__ = ["storage_options", "table_files", "with_credentials"]
