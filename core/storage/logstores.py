"""Where a commit log's records live: the ``Store``s of the file systems sparkeos
reaches (the contract is ``core.snapshot.commitlog.Store``).

``LocalStore`` (POSIX paths, ``file:`` URIs), ``FilesStore`` (HDFS through WebHDFS from
Python: ``webhdfs://`` always, ``hdfs://`` where no JVM is at hand, as under Spark
Connect and in the CLI; the object stores sparkeos writes itself) and ``HadoopStore``
(any Hadoop-compatible URI Spark's own checkpoint can use, through the JVM of a classic
SparkSession). ``open_store`` picks one for a location.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from typing import Any

from sparkeos.core.errors import CommitLogError, ConfigurationError
from sparkeos.core.snapshot.commitlog import SINK_LOGS_DIR, Store, _exists

from .files import OBJECT_STORES, WRITE_ONCE_STORES
from .locations import local_path as local_path
from .locations import parse as parse_location
from .registry import split_uri


class LocalStore(Store):
    def siblings(self) -> list[tuple[str, Store]]:
        return sibling_stores(self.location)

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.location = directory

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def list_names(self) -> list[str]:
        if not os.path.isdir(self.directory):
            return []
        return [n for n in os.listdir(self.directory) if not n.startswith(".")]

    def read(self, name: str) -> bytes:
        with open(self._path(name), "rb") as fh:
            return fh.read()

    def _write_temp(self, data: bytes) -> str:
        os.makedirs(self.directory, exist_ok=True)
        tmp = self._path(f".tmp-{uuid.uuid4().hex}")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return tmp

    def _sync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_new(self, name: str, data: bytes) -> None:
        tmp = self._write_temp(data)
        try:
            # link() fails if the target exists: write-once without a race.
            os.link(tmp, self._path(name))
        except FileExistsError:
            raise _exists(name, self.location) from None
        finally:
            os.unlink(tmp)
        self._sync_dir()

    def replace(self, name: str, data: bytes) -> None:
        tmp = self._write_temp(data)
        os.replace(tmp, self._path(name))
        self._sync_dir()

    def delete(self, name: str) -> None:
        try:
            os.unlink(self._path(name))
        except FileNotFoundError:
            pass


class HadoopStore(Store):
    """A store on any Hadoop-compatible file system, via the SparkSession's JVM."""

    def siblings(self) -> list[tuple[str, Store]]:
        return sibling_stores(self.location)

    def __init__(self, uri: str, spark: Any) -> None:
        self.location = uri
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        self._dir = jvm.org.apache.hadoop.fs.Path(uri)
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        self._conf = conf
        self._gateway = spark.sparkContext._gateway
        self._fs = self._dir.getFileSystem(conf)

    def _path(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._dir, name)

    def list_names(self) -> list[str]:
        if not self._fs.exists(self._dir):
            return []
        names = [s.getPath().getName() for s in self._fs.listStatus(self._dir)]
        return [n for n in names if not n.startswith(".")]

    def read(self, name: str) -> bytes:
        path = self._path(name)
        try:
            stream = self._fs.open(path)
        except Exception as exc:
            if "FileNotFoundException" in str(exc):
                raise FileNotFoundError(path.toString()) from None
            raise
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def _write_temp(self, data: bytes) -> Any:
        self._fs.mkdirs(self._dir)
        tmp = self._path(f".tmp-{uuid.uuid4().hex}")
        out = self._fs.create(tmp, False)
        try:
            out.write(bytearray(data))
            out.hsync()
        finally:
            out.close()
        return tmp

    def write_new(self, name: str, data: bytes) -> None:
        target = self._path(name)
        if self._fs.exists(target):
            raise _exists(name, self.location)
        tmp = self._write_temp(data)
        if not self._fs.rename(tmp, target):
            self._fs.delete(tmp, False)
            if self._fs.exists(target):
                raise _exists(name, self.location)
            raise CommitLogError(
                f"could not rename a commit-log record into {target.toString()}",
                fix="check that the checkpoint file system supports atomic rename",
            )

    def replace(self, name: str, data: bytes) -> None:
        # FileContext's rename with OVERWRITE replaces in one step (HDFS: atomic); a
        # delete followed by a rename would lose the file to a crash in between.
        jvm = self._jvm
        tmp = self._write_temp(data)
        context = jvm.org.apache.hadoop.fs.FileContext.getFileContext(
            self._dir.toUri(), self._conf)
        options = self._gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
        options[0] = jvm.org.apache.hadoop.fs.Options.Rename.OVERWRITE
        context.rename(tmp, self._path(name), options)

    def delete(self, name: str) -> None:
        self._fs.delete(self._path(name), False)


class FilesStore(Store):
    """A store on a file system sparkeos reaches from Python (``core.storage.files``): records
    are written to a temporary name and published without overwrite."""

    def siblings(self) -> list[tuple[str, Store]]:
        return sibling_stores(self.location)

    def __init__(self, location: str) -> None:
        self.location = location
        self._files, self._dir = split_uri(location)

    def _path(self, name: str) -> str:
        return f"{self._dir.rstrip('/')}/{name}"

    def list_names(self) -> list[str]:
        return [n for n in self._files.listdir(self._dir) if not n.startswith(".")]

    def read(self, name: str) -> bytes:
        return self._files.read(self._path(name))

    def write_new(self, name: str, data: bytes) -> None:
        if self._files.atomic_create:
            try:
                self._files.create_new(self._path(name), data)
            except FileExistsError:
                raise _exists(name, self.location) from None
            return
        tmp = self._files.write_temporary(self._dir, data)
        try:
            self._files.publish(tmp, self._path(name))
        except FileExistsError:
            raise _exists(name, self.location) from None
        finally:
            self._files.delete(tmp)

    def replace(self, name: str, data: bytes) -> None:
        self._files.overwrite(self._path(name), data)

    def delete(self, name: str) -> None:
        self._files.delete(self._path(name))


def is_local_uri(location: str) -> bool:
    return parse_location(location).is_local


def open_store(location: str, spark: Any = None) -> Store:
    """A store for a local path / ``file:`` URI, HDFS (``hdfs://``, ``webhdfs://``), or
    any other Hadoop URI given a classic session (its JVM reaches it)."""
    if is_local_uri(location):
        return LocalStore(local_path(location))
    scheme = parse_location(location).scheme
    if scheme in WRITE_ONCE_STORES:
        return FilesStore(location)
    if scheme in OBJECT_STORES:
        raise CommitLogError(
            f"the commit log at {location} would be on an object store ({scheme}://) "
            "sparkeos does not write itself: through Hadoop its rename is a copy and a "
            "create-if-absent is a check followed by a write, so two processes claiming "
            "one batch's outcome (a second driver, `sparkeos recover`) could both win",
            fix="put the query's checkpoint on S3 (s3a://), Google Cloud Storage (gs://) "
            "or Azure Blob Storage (abfss://), written with their conditional writes, on "
            "HDFS, or on a local or shared POSIX path",
        )
    if scheme == "webhdfs" or (scheme == "hdfs" and spark is None):
        return FilesStore(location)
    if spark is None:
        raise CommitLogError(
            f"the commit log at {location} is on a file system sparkeos reaches only "
            "through Spark's JVM (Hadoop's FileSystem)",
            fix="put the checkpoint on a local or mounted path or on HDFS; in classic "
            "PySpark any Hadoop URI works (the CLI needs `--spark` for it)",
        )
    return HadoopStore(location, spark)


def sibling_stores(location: str) -> list[tuple[str, Store]]:
    """The other sinks' log stores of the checkpoint ``location`` belongs to
    (``<checkpoint>/sparkeos/<sink>``): none where the store cannot list them."""
    try:
        files, path = split_uri(location)
    except ConfigurationError:
        return []  # a store only Spark's JVM reaches
    parent = posixpath.dirname(path.rstrip("/"))
    if posixpath.basename(parent) != SINK_LOGS_DIR:
        return []  # not a checkpoint's log (a log of its own, in a test)
    try:
        names = files.listdir(parent)
    except FileNotFoundError:
        return []
    own = posixpath.basename(path.rstrip("/"))
    return [(other, open_store(files.uri(posixpath.join(parent, other))))
            for other in sorted(names) if other != own and not other.startswith(".")
            and files.isdir(posixpath.join(parent, other))]
