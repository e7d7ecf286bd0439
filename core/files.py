"""File systems a Python process (driver or task) can stage and publish files on.

Exactly-once file output needs three things of a file system, and nothing else:

* **write-once creation**: creating a file that exists fails (a zombie attempt can
  never replace a committed file);
* **exclusive claim**: of two attempts claiming the same staging directory, one fails;
* **publish without overwrite**: moving a staged file to its final name fails if the
  name exists, atomically (readers see the whole file or none).

``Files`` is that contract; each file system keeping it is a module of
``core.stores``: POSIX (``O_EXCL``, ``mkdir``, ``link``), HDFS through WebHDFS
(``CREATE`` with ``overwrite=false``, ``RENAME``), and the object stores S3, Google
Cloud Storage and Azure Blob Storage through their conditional creates (one write-once
layer for the three, ``core.stores.writeonce``). Other object stores (``oss://``) are
refused: through Hadoop their copy-based "rename" overwrites, so a zombie could replace
a committed part (see docs/connectors/file.md). ``split_uri`` picks the store of a
location, parsed as Hadoop parses it (``core.locations``).

Paths given to a ``Files`` are absolute paths inside that file system (``/data/out``);
``uri(path)`` gives the full URI for messages.
"""

from __future__ import annotations

import getpass
import os
import posixpath
import uuid
from abc import ABC, abstractmethod

from .errors import ConfigurationError
from .locations import Location
from .locations import parse as parse_location

OBJECT_STORES = ("s3", "s3a", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "oss", "r2")
"""Schemes of object stores: no atomic rename, no create-if-absent through Hadoop."""
S3_SCHEMES = ("s3", "s3a", "s3n")
GCS_SCHEMES = ("gs",)
AZURE_SCHEMES = ("abfs", "abfss", "wasb", "wasbs")
WRITE_ONCE_STORES = S3_SCHEMES + GCS_SCHEMES + AZURE_SCHEMES
"""The object stores sparkeos writes itself, by their conditional creates
(``core.stores``)."""


class Files(ABC):
    """One file system. Every method takes absolute paths inside it."""

    @abstractmethod
    def uri(self, path: str) -> str: ...

    @property
    def is_local(self) -> bool:
        return False

    @property
    def atomic_create(self) -> bool:
        """``create_new`` makes the file visible whole or not at all (an object store's
        ``PUT``): a write-once record needs no temporary name then."""
        return False

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def isdir(self, path: str) -> bool: ...

    @abstractmethod
    def makedirs(self, path: str) -> None: ...

    @abstractmethod
    def claim_dir(self, path: str) -> bool:
        """Create ``path`` for this caller only: False if it exists (another claimed it)."""

    @abstractmethod
    def create_new(self, path: str, data: bytes) -> None:
        """Write ``path`` whole; ``FileExistsError`` if it exists."""

    @abstractmethod
    def upload_new(self, local_file: str, path: str) -> None:
        """Copy a local file to ``path``; ``FileExistsError`` if it exists."""

    @abstractmethod
    def publish(self, staged: str, final: str) -> None:
        """Give ``staged`` the name ``final``, atomically and never over an existing file:
        ``FileExistsError`` if ``final`` exists, ``FileNotFoundError`` if ``staged`` does not.
        ``staged`` may be gone afterwards (moved) or kept (linked)."""

    @abstractmethod
    def replace(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst``, replacing ``dst`` if present."""

    def write_temporary(self, directory: str, data: bytes) -> str:
        """Write ``data`` whole to a new hidden file in ``directory`` (made if needed);
        its path."""
        self.makedirs(directory)
        temporary = posixpath.join(directory, f".tmp-{uuid.uuid4().hex}")
        self.create_new(temporary, data)
        return temporary

    def overwrite(self, path: str, data: bytes) -> None:
        """Write ``path`` whole, replacing what it holds: a reader sees the old data or
        the new, never a part (a temporary file beside it, then ``replace``)."""
        self.replace(self.write_temporary(posixpath.dirname(path), data), path)

    @abstractmethod
    def listdir(self, path: str) -> list[str]:
        """Names in ``path``; ``[]`` if it does not exist."""

    @abstractmethod
    def read(self, path: str) -> bytes: ...

    @abstractmethod
    def delete(self, path: str) -> None:
        """Delete a file or a whole directory; nothing if it does not exist."""

    def make_durable(self, path: str) -> None:  # noqa: B027 - most stores need nothing
        """Make ``path``'s data (or a directory's entries) survive a crash of this host."""


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


def __getattr__(name: str) -> object:
    # The stores moved to core.stores (0.1 kept them here): old imports keep working.
    if name == "LocalFiles":
        from .stores.local import LocalFiles

        return LocalFiles
    if name == "WebHdfsFiles":
        from .stores.webhdfs import WebHdfsFiles

        return WebHdfsFiles
    if name == "WEBHDFS_PORT_ENV":
        from .stores.webhdfs import WEBHDFS_PORT_ENV

        return WEBHDFS_PORT_ENV
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["AZURE_SCHEMES", "GCS_SCHEMES", "OBJECT_STORES", "S3_SCHEMES", "WRITE_ONCE_STORES",
           "Files", "resolve_location", "split_uri"]
