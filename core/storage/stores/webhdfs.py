"""HDFS through the NameNode's WebHDFS REST API as a ``Files``.

``CREATE`` with ``overwrite=false`` creates write-once, ``RENAME`` never replaces an
existing file: pure Python, no JVM and no native ``libhdfs`` in the process, so it works
in Spark tasks and under Spark Connect alike.
"""

from __future__ import annotations

import json
import posixpath
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from sparkeos.core.errors import RetriableError
from sparkeos.core.storage.files import Files

WEBHDFS_PORT_ENV = "SPARKEOS_WEBHDFS_PORT"
"""The NameNode's HTTP port for ``hdfs://`` URIs (default 9870, Hadoop 3's)."""
DEFAULT_WEBHDFS_PORT = 9870


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


__all__ = ["DEFAULT_WEBHDFS_PORT", "WEBHDFS_PORT_ENV", "WebHdfsFiles"]
