"""Which ``Files`` a location is on: the registry of ``core.storage.stores`` by URI
scheme (``split_uri``), and a location as every process reads it
(``resolve_location``)."""

from __future__ import annotations

import getpass
import os

from sparkeos.core.errors import ConfigurationError

from .files import AZURE_SCHEMES, GCS_SCHEMES, OBJECT_STORES, WRITE_ONCE_STORES, Files
from .locations import Location
from .locations import parse as parse_location


def split_uri(location: str) -> tuple[Files, str]:
    """The file system of ``location`` (a path or URI) and the path inside it."""
    parsed = parse_location(location)
    scheme = parsed.scheme
    if parsed.is_local:
        from .stores.local import LocalFiles

        path = parsed.path if scheme == "file" else location
        return LocalFiles(), os.path.abspath(os.path.expanduser(path))
    if scheme in ("hdfs", "webhdfs"):
        return _webhdfs(location, parsed), parsed.normalized_path()
    if scheme in WRITE_ONCE_STORES:
        return _object_store(location, parsed), parsed.normalized_path()
    if scheme in OBJECT_STORES:
        raise ConfigurationError(
            f"{location!r} is on an object store sparkeos does not write ({scheme}://): "
            "its write-once records and publishing need the store's conditional writes, "
            "which sparkeos uses on S3, Google Cloud Storage and Azure Blob Storage",
            fix="use an s3a://, gs:// or abfss:// URI, HDFS, or a local or shared POSIX "
            "path; see docs/connectors/file.md",
        )
    raise ConfigurationError(
        f"{location!r}: sparkeos cannot write files on {scheme}://",
        fix="use a local or shared POSIX path, an hdfs:// or webhdfs:// URI, or an "
        "s3a://, gs:// or abfss:// URI",
    )


def _webhdfs(location: str, parsed: Location) -> Files:
    from .stores.webhdfs import DEFAULT_WEBHDFS_PORT, WEBHDFS_PORT_ENV, WebHdfsFiles

    if not parsed.hostname:
        raise ConfigurationError(
            f"{location!r} names no NameNode",
            fix=f"write the host and port: {parsed.scheme}://namenode:<port>/path",
        )
    if parsed.scheme == "webhdfs":
        http_port = parsed.port or DEFAULT_WEBHDFS_PORT
    else:
        http_port = int(os.environ.get(WEBHDFS_PORT_ENV) or DEFAULT_WEBHDFS_PORT)
    user = os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
    return WebHdfsFiles(parsed.scheme, parsed.authority,
                        f"http://{parsed.hostname}:{http_port}", user)


def _object_store(location: str, parsed: Location) -> Files:
    scheme = parsed.scheme
    if scheme in AZURE_SCHEMES:
        from .stores.azure import AzureBlobFiles

        return AzureBlobFiles.from_location(location, parsed)
    if not parsed.authority:
        raise ConfigurationError(f"{location!r} names no bucket",
                                 fix=f"write the bucket: {scheme}://bucket/path")
    if scheme in GCS_SCHEMES:
        from .stores.gcs import GcsFiles

        return GcsFiles.from_environment(scheme, parsed.authority)
    from .stores.s3 import S3Files

    return S3Files.from_environment(scheme, parsed.authority)


def resolve_location(location: str) -> str:
    """``location`` as every process reads it the same: a local path made absolute, an
    ``hdfs://`` URI as the ``webhdfs://`` URI of its NameNode's HTTP port (resolved
    here, on the driver: executors need no setting), an object store's URI as it is.
    Raises ``ConfigurationError`` for
    what ``split_uri`` refuses."""
    from .stores.webhdfs import WebHdfsFiles

    files, path = split_uri(location)
    if isinstance(files, WebHdfsFiles):
        return f"webhdfs://{files.http.removeprefix('http://')}{path}"
    return path if files.is_local else files.uri(path)

