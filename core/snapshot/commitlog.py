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

import functools
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sparkeos.core.errors import CommitLogError, RecordExistsError

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

    def siblings(self) -> list[tuple[str, Store]]:
        """The stores of the other sinks' logs of the checkpoint this log lies in
        (``<checkpoint>/sparkeos/<sink>``), by sink name: none where the store cannot
        list them."""
        return []


SINK_LOGS_DIR = "sparkeos"
"""The directory of a checkpoint that holds one commit log per sink name."""


def sink_log_location(checkpoint_location: str, sink: str) -> str:
    return f"{checkpoint_location.rstrip('/')}/{SINK_LOGS_DIR}/{sink}"


def checkpoint_of_log(log_location: str) -> str:
    """The query checkpoint a sink's commit log lies under (``sink_log_location``'s
    inverse)."""
    return log_location.rsplit(f"/{SINK_LOGS_DIR}/", 1)[0]


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


@functools.lru_cache(maxsize=4096)
def parse_record_name(name: str) -> tuple[int, str, int | None] | None:
    """(batch, kind, run) of a record's file name; None for any other file."""
    # Cached: every read of the log parses every name again (in the model check, a
    # twenty-fifth of the instructions went to parsing the same few names).
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


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
"""What ``_dump`` writes with, made once: ``json.dumps`` with these options makes a new
encoder at every call (measured: a third of the time a record takes to encode)."""


def _dump(data: dict[str, Any]) -> bytes:
    return _ENCODER.encode(data).encode()
