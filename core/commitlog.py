"""The durable commit log: the coordinator's memory across crashes.

Per sink, a directory ``<checkpointLocation>/sparkeos/<sink name>/`` holds one small
JSON file per record. Every record is written to a temporary name, made durable
and linked into place, so a reader sees a record whole or not at all. Records are
write-once (creating one that exists fails), so two processes racing to write the
same record cannot both succeed; the state of a batch is the set of its records:

``begun.<run>``    run ``run`` (a batch attempt) starts: every transaction ID its task
                   attempts may use is now a function of this record
``outcome.<run>``  the one outcome of that run, first writer wins: ``decided`` (every
                   participant prepared; N must be committed, with the receipts) or
                   ``aborted`` (nothing of the run may ever be committed)
``finished``       every participant of the decided run is committed

Beside the records: ``sink.json`` (what the log belongs to), ``lease.json`` (the
running query renews it every batch; operator commands refuse to act while it is
fresh) and ``last-error.json``.

Stores: ``LocalStore`` (POSIX paths, ``file:`` URIs), ``FilesStore`` (HDFS through
WebHDFS from Python: ``webhdfs://`` always, ``hdfs://`` where no JVM is at hand, as
under Spark Connect and in the CLI) and ``HadoopStore`` (any Hadoop-compatible URI
Spark's own checkpoint can use, through the JVM of a classic SparkSession). A
database-backed store implements the same ``Store``.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import CommitLogError, RecordExistsError
from .files import OBJECT_STORES, WRITE_ONCE_STORES, split_uri
from .locations import local_path as local_path
from .locations import parse as parse_location

BEGUN, OUTCOME, FINISHED = "begun", "outcome", "finished"
DECIDED, ABORTED = "decided", "aborted"
"""The two values of an outcome record."""
_KINDS = (BEGUN, OUTCOME, FINISHED)
_RECORD = re.compile(r"^(\d{20})\.(begun|outcome|finished)(?:\.(\d+))?\.json$")
META = "sink.json"
IDENTITY_PINNED = "identity_pinned"
"""Set in ``sink.json`` once a batch is decided: from then on the destination is fixed."""
LEASE = "lease.json"
LAST_ERROR = "last-error.json"


class Store(ABC):
    """Where records live. Names are flat (no sub-directories)."""

    location: str

    @abstractmethod
    def list_names(self) -> list[str]: ...

    @abstractmethod
    def read(self, name: str) -> bytes: ...

    @abstractmethod
    def write_new(self, name: str, data: bytes) -> None:
        """Durably create ``name``; raise ``RecordExistsError`` if it exists."""

    @abstractmethod
    def replace(self, name: str, data: bytes) -> None:
        """Durably write ``name``, replacing it if present."""

    @abstractmethod
    def delete(self, name: str) -> None: ...


class LocalStore(Store):
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
    """A store on a file system sparkeos reaches from Python (``core.files``): records
    are written to a temporary name and published without overwrite."""

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


SINK_LOGS_DIR = "sparkeos"
"""The directory of a checkpoint that holds one commit log per sink name."""


def sink_log_location(checkpoint_location: str, sink: str) -> str:
    return f"{checkpoint_location.rstrip('/')}/{SINK_LOGS_DIR}/{sink}"


def checkpoint_of_log(log_location: str) -> str:
    """The query checkpoint a sink's commit log lies under (``sink_log_location``'s
    inverse)."""
    return log_location.rsplit(f"/{SINK_LOGS_DIR}/", 1)[0]


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


def _exists(name: str, location: str) -> RecordExistsError:
    return RecordExistsError(
        f"commit-log record {name} already exists in {location}",
        fix="another process wrote it first (a second driver or `sparkeos recover` on the "
        "same checkpoint); run one query per checkpointLocation, unique sink names, and "
        "recover only while the query is stopped",
    )


@dataclass
class BatchState:
    """Everything the log says about one batch."""

    batch_id: int
    begun: dict[int, dict[str, Any]] = field(default_factory=dict)
    outcomes: dict[int, dict[str, Any]] = field(default_factory=dict)
    finished: dict[str, Any] | None = None

    @property
    def last_attempt(self) -> int:
        """The highest run begun (-1 if none)."""
        return max(self.begun, default=-1)

    @property
    def decided_run(self) -> int | None:
        for run, outcome in self.outcomes.items():
            if outcome.get("outcome") == DECIDED:
                return run
        return None

    @property
    def decided(self) -> dict[str, Any] | None:
        run = self.decided_run
        return None if run is None else self.outcomes[run]

    @property
    def aborted(self) -> set[int]:
        return {r for r, o in self.outcomes.items() if o.get("outcome") == ABORTED}

    @property
    def open_runs(self) -> list[int]:
        """Runs that began and have no outcome yet (their tasks may hold prepared state
        that may still be decided)."""
        return sorted(r for r in self.begun if r not in self.outcomes)

    @property
    def needs_commit(self) -> bool:
        return self.decided is not None and self.finished is None

    @property
    def needs_rollback(self) -> bool:
        """A run began and was neither decided nor aborted."""
        return bool(self.open_runs)

    @property
    def unresolved(self) -> bool:
        return self.needs_commit or self.needs_rollback

    @property
    def status(self) -> str:
        if self.finished is not None:
            return "finished"
        if self.decided is not None:
            return "decided"
        if self.needs_rollback:
            return "begun"
        return "aborted"


def parse_record_name(name: str) -> tuple[int, str, int | None] | None:
    """(batch, kind, run) of a record's file name; None for any other file."""
    match = _RECORD.match(name)
    if not match:
        return None
    return int(match.group(1)), match.group(2), (
        int(match.group(3)) if match.group(3) is not None else None)


def record_name(batch_id: int, kind: str, run: int | None = None) -> str:
    if kind not in _KINDS:
        raise ValueError(kind)
    suffix = f".{run}" if run is not None else ""
    return f"{batch_id:020d}.{kind}{suffix}.json"


class CommitLog:
    """Typed access to one sink's records in a ``Store``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @property
    def location(self) -> str:
        return self.store.location

    # -- metadata --------------------------------------------------------------------
    def read_meta(self) -> dict[str, Any] | None:
        return self._load_if_present(META)

    def write_meta(self, meta: dict[str, Any]) -> None:
        self.store.replace(META, _dump(meta))

    def read_lease(self) -> dict[str, Any] | None:
        return self._load_if_present(LEASE)

    def write_lease(self, lease: dict[str, Any]) -> None:
        self.store.replace(LEASE, _dump(lease))

    def record_error(self, error: dict[str, Any]) -> None:
        self.store.replace(LAST_ERROR, _dump(error))

    def last_error(self) -> dict[str, Any] | None:
        return self._load_if_present(LAST_ERROR)

    def _load_if_present(self, name: str) -> dict[str, Any] | None:
        if name not in self.store.list_names():
            return None
        try:
            return self._load(name)
        except FileNotFoundError:
            return None

    # -- records ---------------------------------------------------------------------
    def append(
        self, batch_id: int, kind: str, payload: dict[str, Any], run: int | None = None
    ) -> dict[str, Any]:
        """Create a record; ``RecordExistsError`` if another process created it first."""
        body = {"batch_id": batch_id, "kind": kind, "run": run, **payload}
        self.store.write_new(record_name(batch_id, kind, run), _dump(body))
        return body

    def claim(
        self, batch_id: int, kind: str, payload: dict[str, Any], run: int | None = None
    ) -> dict[str, Any]:
        """Create a record unless one exists; return the record that holds (first
        writer wins: the caller compares it with what it wanted)."""
        try:
            return self.append(batch_id, kind, payload, run)
        except RecordExistsError:
            return self._load(record_name(batch_id, kind, run))

    def batches(self) -> dict[int, BatchState]:
        """Every batch's state; a record that cannot be read is a ``CommitLogError``."""
        return self.scan(strict=True)[0]

    def scan(self, strict: bool = False) -> tuple[dict[int, BatchState], list[str]]:
        """The batches' states and, unless ``strict``, the records that could not be
        read (as messages) instead of an error: what ``sparkeos status`` shows.

        A record listed but gone when read was purged meanwhile (the running query
        purges resolved batches past ``retain_batches``; nothing else deletes records):
        its batch is left out, as it would be from a listing a moment later, rather
        than shown with half its records (a decided batch read without its outcome would
        look undecided)."""
        states: dict[int, BatchState] = {}
        unreadable: list[str] = []
        purged: set[int] = set()
        for name in sorted(self.store.list_names()):
            parsed = parse_record_name(name)
            if parsed is None:
                continue
            batch_id, kind, run = parsed
            state = states.setdefault(batch_id, BatchState(batch_id))
            try:
                body = self._load(name)
            except FileNotFoundError:
                purged.add(batch_id)
                continue
            except CommitLogError as exc:
                if strict:
                    raise
                unreadable.append(exc.problem)
                continue
            if kind == BEGUN and run is not None:
                state.begun[run] = body
            elif kind == OUTCOME and run is not None:
                state.outcomes[run] = body
            elif kind == FINISHED:
                state.finished = body
        for batch_id in purged:
            states.pop(batch_id, None)
        return states, unreadable

    def purge_before(self, batch_id: int, states: Iterable[BatchState]) -> None:
        """Delete resolved records of batches older than ``batch_id``."""
        for state in states:
            if state.batch_id >= batch_id or state.unresolved:
                continue
            # begun first, finished last: a crash part-way leaves records that still
            # read as resolved (never a begun run without its outcome).
            for run in state.begun:
                self.store.delete(record_name(state.batch_id, BEGUN, run))
            for run in state.outcomes:
                self.store.delete(record_name(state.batch_id, OUTCOME, run))
            self.store.delete(record_name(state.batch_id, FINISHED))

    def _load(self, name: str) -> dict[str, Any]:
        raw = self.store.read(name)
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise CommitLogError(
                f"commit-log record {name} in {self.location} is not valid JSON ({exc})",
                fix="the file was changed by hand or by another tool; restore it from a "
                "backup of the checkpoint, or move the sink's commit-log directory aside if "
                "the query is to start over",
            ) from None
        if not isinstance(data, dict):
            raise CommitLogError(f"commit-log record {name} is not a JSON object")
        return data


def _dump(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
