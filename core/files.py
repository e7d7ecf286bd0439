"""File systems a Python process (driver or task) can stage and publish files on.

Exactly-once file output needs three things of a file system, and nothing else:

* **write-once creation**: creating a file that exists fails (a zombie attempt can
  never replace a committed file);
* **exclusive claim**: of two attempts claiming the same staging directory, one fails;
* **publish without overwrite**: moving a staged file to its final name fails if the
  name exists, atomically (readers see the whole file or none).

``LocalFiles`` gets them from POSIX (``O_EXCL``, ``mkdir``, ``link``). ``WebHdfsFiles``
gets them from HDFS through its REST API, WebHDFS (``CREATE`` with ``overwrite=false``,
``RENAME``, which never replaces an existing file): pure Python, no JVM and no native
``libhdfs`` in the process, so it works in Spark tasks and under Spark Connect alike.
``S3Files`` (``core.objectstore``) gets them from an S3-compatible store's conditional
writes (``If-None-Match: *``). Other object stores (GCS, ABFS) are refused: through
Hadoop their copy-based "rename" overwrites, so a zombie could replace a committed part
(see docs/connectors/file.md).

Paths given to a ``Files`` are absolute paths inside that file system (``/data/out``);
``uri(path)`` gives the full URI for messages.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import posixpath
import shutil
import urllib.error
import urllib.parse
import urllib.request
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError, RetriableError
from .locations import parse as parse_location

WEBHDFS_PORT_ENV = "SPARKEOS_WEBHDFS_PORT"
"""The NameNode's HTTP port for ``hdfs://`` URIs (default 9870, Hadoop 3's)."""
DEFAULT_WEBHDFS_PORT = 9870
OBJECT_STORES = ("s3", "s3a", "s3n", "gs", "abfs", "abfss", "wasb", "wasbs", "oss", "r2")
"""Schemes of object stores: no atomic rename, no create-if-absent through Hadoop."""
S3_SCHEMES = ("s3", "s3a", "s3n")
"""The object stores sparkeos writes itself, with conditional writes (``core.objectstore``)."""


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


@dataclass(frozen=True)
class LocalFiles(Files):
    """POSIX paths (a local disk, or a shared mount such as NFS)."""

    def uri(self, path: str) -> str:
        return path

    @property
    def is_local(self) -> bool:
        return True

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def claim_dir(self, path: str) -> bool:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path)  # never succeeds twice
        except FileExistsError:
            return False
        return True

    def create_new(self, path: str, data: bytes) -> None:
        with open(path, "xb") as fh:
            fh.write(data)

    def upload_new(self, local_file: str, path: str) -> None:
        with open(local_file, "rb") as src, open(path, "xb") as dst:
            shutil.copyfileobj(src, dst)

    def publish(self, staged: str, final: str) -> None:
        # rename() replaces silently, link() does not.
        os.link(staged, final)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def read(self, path: str) -> bytes:
        with open(path, "rb") as fh:
            return fh.read()

    def delete(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def make_durable(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class WebHdfsFiles(Files):
    """HDFS through the NameNode's WebHDFS REST API (``http://host:port/webhdfs/v1``).

    A file written through ``CREATE`` is on the DataNodes' pipeline when the call
    returns (HDFS's close): durable against the loss of this process and host."""

    scheme: str
    authority: str
    """``host:port`` of the URIs (the RPC port for ``hdfs://``)."""
    http: str
    """``http://host:port`` of the NameNode's web server."""
    user: str
    timeout: float = 60.0

    def uri(self, path: str) -> str:
        return f"{self.scheme}://{self.authority}{path}"

    # -- the REST calls ----------------------------------------------------------------------
    def _url(self, path: str, op: str, **params: Any) -> str:
        query = {"op": op, "user.name": self.user, **{k: str(v) for k, v in params.items()}}
        return (f"{self.http}/webhdfs/v1{urllib.parse.quote(path)}?"
                f"{urllib.parse.urlencode(query)}")

    def _call(self, method: str, url: str, data: bytes | None = None, *,
              raw: bool = False) -> Any:
        request = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/octet-stream")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise self._error(exc, url) from None
        except (urllib.error.URLError, OSError) as exc:
            raise RetriableError(
                f"HDFS at {self.http} (WebHDFS) cannot be reached: {exc}",
                fix=f"start the NameNode, or check the URI; for hdfs:// URIs sparkeos "
                f"reaches the NameNode's HTTP port (set {WEBHDFS_PORT_ENV}, default "
                f"{DEFAULT_WEBHDFS_PORT}, or use webhdfs://host:<http port>/...)",
            ) from None
        if raw:
            return body
        if not body:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return body

    def _error(self, exc: urllib.error.HTTPError, url: str) -> Exception:
        try:
            remote = json.loads(exc.read())["RemoteException"]
            kind, message = remote.get("exception", ""), remote.get("message", "")
        except Exception:
            kind, message = "", str(exc)
        message = message.splitlines()[0] if message else str(exc)
        if kind == "FileNotFoundException" or exc.code == 404:
            return FileNotFoundError(message)
        if kind in ("FileAlreadyExistsException", "AlreadyBeingCreatedException"):
            return FileExistsError(message)
        if kind in ("SafeModeException", "RetriableException", "StandbyException"):
            return RetriableError(f"HDFS refused {url.split('?')[0]}: {kind}: {message}",
                                  fix="wait for the NameNode to leave safe mode; retried")
        return OSError(f"WebHDFS {kind or exc.code}: {message}")

    def _status(self, path: str) -> dict[str, Any] | None:
        try:
            answer = self._call("GET", self._url(path, "GETFILESTATUS"))
        except FileNotFoundError:
            return None
        status: dict[str, Any] = answer["FileStatus"]
        return status

    def _put_data(self, path: str, data: bytes) -> None:
        # Two steps: the NameNode names a DataNode (noredirect: urllib does not follow a
        # redirected PUT with a body), then the data goes there.
        answer = self._call("PUT", self._url(path, "CREATE", overwrite="false",
                                             noredirect="true"), b"")
        location = answer["Location"] if isinstance(answer, dict) else None
        if not location:
            raise OSError(f"WebHDFS CREATE {path} answered without a DataNode location")
        self._call("PUT", location, data)

    # -- Files ---------------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return self._status(path) is not None

    def isdir(self, path: str) -> bool:
        status = self._status(path)
        return status is not None and status.get("type") == "DIRECTORY"

    def makedirs(self, path: str) -> None:
        if not self._call("PUT", self._url(path, "MKDIRS"))["boolean"]:
            raise OSError(f"could not create directory {self.uri(path)}")

    def claim_dir(self, path: str) -> bool:
        # MKDIRS succeeds on an existing directory: the claim is a file inside it,
        # created write-once.
        self.makedirs(path)
        try:
            self._put_data(posixpath.join(path, ".claim"), b"")
        except FileExistsError:
            return False
        return True

    def create_new(self, path: str, data: bytes) -> None:
        self._put_data(path, data)

    def upload_new(self, local_file: str, path: str) -> None:
        with open(local_file, "rb") as fh:
            self._put_data(path, fh.read())

    def publish(self, staged: str, final: str) -> None:
        if self._call("PUT", self._url(staged, "RENAME", destination=final))["boolean"]:
            return
        # HDFS rename says false, not why: an existing target, or a missing source.
        if self.exists(final):
            raise FileExistsError(self.uri(final))
        raise FileNotFoundError(self.uri(staged))

    def replace(self, src: str, dst: str) -> None:
        self._call("PUT", self._url(src, "RENAME", destination=dst,
                                    renameoptions="OVERWRITE"))

    def listdir(self, path: str) -> list[str]:
        try:
            answer = self._call("GET", self._url(path, "LISTSTATUS"))
        except FileNotFoundError:
            return []
        return [s["pathSuffix"] for s in answer["FileStatuses"]["FileStatus"]]

    def read(self, path: str) -> bytes:
        # OPEN redirects a GET to a DataNode, which urllib follows.
        data: bytes = self._call("GET", self._url(path, "OPEN"), raw=True)
        return data

    def delete(self, path: str) -> None:
        self._call("DELETE", self._url(path, "DELETE", recursive="true"))


def split_uri(location: str) -> tuple[Files, str]:
    """The file system of ``location`` (a path or URI) and the path inside it."""
    parsed = parse_location(location)
    scheme = parsed.scheme
    if parsed.is_local:
        path = parsed.path if scheme == "file" else location
        return LocalFiles(), os.path.abspath(os.path.expanduser(path))
    if scheme in ("hdfs", "webhdfs"):
        if not parsed.hostname:
            raise ConfigurationError(
                f"{location!r} names no NameNode",
                fix=f"write the host and port: {scheme}://namenode:<port>/path",
            )
        if scheme == "webhdfs":
            http_port = parsed.port or DEFAULT_WEBHDFS_PORT
        else:
            http_port = int(os.environ.get(WEBHDFS_PORT_ENV) or DEFAULT_WEBHDFS_PORT)
        user = os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
        files = WebHdfsFiles(scheme, parsed.authority,
                             f"http://{parsed.hostname}:{http_port}", user)
        return files, parsed.normalized_path()
    if scheme in S3_SCHEMES:
        from .objectstore import S3Files

        if not parsed.authority:
            raise ConfigurationError(f"{location!r} names no bucket",
                                     fix=f"write the bucket: {scheme}://bucket/path")
        return (S3Files.from_environment(scheme, parsed.authority),
                parsed.normalized_path())
    if scheme in OBJECT_STORES:
        raise ConfigurationError(
            f"{location!r} is on an object store sparkeos does not write yet ({scheme}://): "
            "its write-once records and publishing need the store's conditional writes, "
            "which sparkeos uses on S3-compatible stores only",
            fix="use an s3a:// URI (Amazon S3 or an S3-compatible store), HDFS, or a local "
            "or shared POSIX path; see docs/connectors/file.md",
        )
    raise ConfigurationError(
        f"{location!r}: sparkeos cannot write files on {scheme}://",
        fix="use a local or shared POSIX path, or an hdfs:// or webhdfs:// URI",
    )


def resolve_location(location: str) -> str:
    """``location`` as every process reads it the same: a local path made absolute, an
    ``hdfs://`` URI as the ``webhdfs://`` URI of its NameNode's HTTP port (resolved
    here, on the driver: executors need no setting), an object store's URI as it is.
    Raises ``ConfigurationError`` for
    what ``split_uri`` refuses."""
    files, path = split_uri(location)
    if isinstance(files, WebHdfsFiles):
        return f"webhdfs://{files.http.removeprefix('http://')}{path}"
    return path if files.is_local else files.uri(path)


__all__ = ["OBJECT_STORES", "S3_SCHEMES", "WEBHDFS_PORT_ENV", "Files", "LocalFiles", "WebHdfsFiles",
           "resolve_location", "split_uri"]
