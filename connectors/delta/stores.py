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
  refused by the same probe as sparkeos' own writes (``check_conditional_writes``),
  before anything is written. delta-rs is given the endpoint and region the ``S3Files``
  resolved (the same settings Spark's S3A reads); credentials it reads from the
  environment, as boto3 does (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``...), never from
  the sink.
- **Google Cloud Storage, Azure and HDFS** are refused up front, with the fix.
"""

from __future__ import annotations

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.storage.attempts import SPARKEOS_DIR, TableFiles
from sparkeos.core.storage.registry import split_uri
from sparkeos.core.storage.stores.s3 import S3Files


def table_files(path: str) -> TableFiles:
    """The table's directory at ``path`` (a local path, ``file:`` or S3 URI)."""
    files, root = split_uri(path)
    if not files.is_local and not isinstance(files, S3Files):
        raise ConfigurationError(
            f"DeltaSink writes tables on local paths and S3 so far, not {path}",
            fix="write the table to a local or mounted path or to s3a://bucket/...; "
            "Google Cloud Storage, Azure and HDFS come next (issue 51)")
    return TableFiles(files, root)


def storage_options(where: TableFiles) -> dict[str, str] | None:
    """delta-rs' ``storage_options`` for the table (None: a local path)."""
    files = where.files
    if not isinstance(files, S3Files):
        return None
    options = {"AWS_REGION": files.region}
    if files.endpoint:
        options["AWS_ENDPOINT_URL"] = files.endpoint
        if files.endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    return options


def check_store(where: TableFiles) -> None:
    """Refuse a store whose create-if-absent does not hold (delta-rs' log commits and
    sparkeos' claims rest on it); nothing for a local path."""
    files = where.files
    if isinstance(files, S3Files):
        files.check_conditional_writes(where.path(f"{SPARKEOS_DIR}/probe"))


__all__ = ["check_store", "storage_options", "table_files"]
