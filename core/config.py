"""Configuration shared by every sink: guarantees, coordinator settings, and the
session settings Spark carries into a task (``task_property``)."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from .errors import ConfigurationError

_SINK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Guarantee(enum.Enum):
    """Processing guarantee of a sink, strongest first."""

    EXACTLY_ONCE = "exactly_once"
    AT_LEAST_ONCE = "at_least_once"
    NONE = "none"

    @property
    def strength(self) -> int:
        return {"exactly_once": 2, "at_least_once": 1, "none": 0}[self.value]

    @classmethod
    def parse(cls, value: Guarantee | str) -> Guarantee:
        if isinstance(value, Guarantee):
            return value
        try:
            return cls(value.lower().replace("-", "_"))
        except ValueError:
            names = ", ".join(g.value for g in cls)
            raise ConfigurationError(
                f"unknown processing guarantee {value!r}", fix=f"use one of: {names}"
            ) from None


EXISTING_OUTPUT = ("refuse", "accept")


def validate_existing_output(value: str, sink: str | None) -> str:
    """What to do with another query's output of the sink name (a lost checkpoint)."""
    if value not in EXISTING_OUTPUT:
        raise ConfigurationError(
            f"existing_output={value!r}", sink=sink,
            fix="use 'refuse' (default) or 'accept' to write beside another query's "
            "output of this sink name on purpose")
    return value


def validate_sink_name(name: str) -> str:
    """Sink names become parts of transaction IDs and paths: keep them plain."""
    if not isinstance(name, str) or not _SINK_NAME.match(name):
        raise ConfigurationError(
            f"invalid sink name {name!r}",
            fix="use 1-64 characters of letters, digits, '_', '.', '-', starting with a "
            "letter or digit; the name must stay the same across restarts of the query",
        )
    return name


@dataclass(frozen=True)
class CoordinatorConfig:
    """Settings of the foreachBatch adapter.

    ``retain_batches``: how many batches of commit-log records to keep (at least as many
    as Spark's ``spark.sql.streaming.minBatchesToRetain``, default 100, so that any batch
    Spark may re-run is still on record).
    ``commit_parallelism``: driver threads used to commit the participants of a batch;
    for a sink that merges commits (Kafka), also the most transactions a batch whose
    phase 2 runs in one process (the format route) commits in
    (``core.snapshot.committers``).
    ``task_attempts``: the range of Spark task attempt numbers a batch's phase 1 may use
    (every attempt number has its own transaction ID; ``begun`` records the range so
    recovery knows every ID). Keep it above ``spark.task.maxFailures`` plus speculative
    copies; an attempt outside the range refuses to write (the batch then fails and is
    re-run, nothing is lost).
    ``lease_ttl_s``: how long the lease the running query renews every batch keeps
    ``sparkeos recover`` from acting (without ``--force``).
    ``writers``: how many participants (transactions) write a batch at most. A batch
    with more partitions is coalesced (no shuffle, deterministic) to this many before
    phase 1, so per-transaction costs do not grow with ``spark.sql.shuffle.partitions``.
    Default ``None``: the cores the query's executors have (Spark's
    ``defaultParallelism``). A batch with fewer partitions keeps its partitioning.
    ``existing_output``: what to do when a sink whose commit log never decided a batch
    finds committed output of the same sink name from another query (a lost or new
    checkpoint): ``"refuse"`` (default: a ``ConfigurationError`` before anything is
    written) or ``"accept"`` (write anyway: the rows of the old query stay, and
    whatever this query re-processes is written again).
    ``overlap_commits``: return to Spark once a batch is decided and run its phase 2
    (the commits) in the background, beside the next batch's phase 1 (on the pool's
    other slot). Throughput rises by up to the time of phase 2; the records of a batch
    become visible after Spark saw the batch end (``BatchMetrics.visible_ms``), before
    the next batch with data returns to Spark. ``processAllAvailable()``, the end of
    the query, of Spark's context and of the driver wait for the last commit and raise
    its failure (``core.streaming.ending``), as the adapter's ``flush()`` does; the
    metrics callback runs on the commit thread. A failure of a background phase 2
    stops the query at the next batch, whoever else saw it first; the batch stays
    decided and the next recovery commits it. Default
    ``None``: on where those ends are held, a foreachBatch query in a classic session
    under exactly-once (``core.streaming.ending.overlaps``); off under Spark Connect, at
    least once, in the format route and for a ``Coordinator`` used directly (none of
    them has a process whose end sparkeos can hold).
    """

    name: str
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    checkpoint_location: str | None = None
    retain_batches: int = 100
    commit_parallelism: int = 4
    task_attempts: int = 8
    lease_ttl_s: float = 300.0
    existing_output: str = "refuse"
    writers: int | None = None
    overlap_commits: bool | None = None

    def __post_init__(self) -> None:
        validate_sink_name(self.name)
        object.__setattr__(self, "guarantee", Guarantee.parse(self.guarantee))
        if self.retain_batches < 2:
            raise ConfigurationError(
                f"retain_batches={self.retain_batches} is too small",
                sink=self.name,
                fix="keep at least 2 batches (default 100, as Spark's minBatchesToRetain)",
            )
        if self.commit_parallelism < 1:
            raise ConfigurationError(
                f"commit_parallelism={self.commit_parallelism} must be >= 1", sink=self.name
            )
        if not isinstance(self.task_attempts, int) or not 1 <= self.task_attempts <= 256:
            raise ConfigurationError(
                f"task_attempts={self.task_attempts!r} must be a whole number from 1 to 256",
                sink=self.name,
                fix="keep it above spark.task.maxFailures plus speculative copies (default 8)",
            )
        validate_existing_output(self.existing_output, self.name)
        if self.writers is not None and (
                not isinstance(self.writers, int) or isinstance(self.writers, bool)
                or self.writers < 1):
            raise ConfigurationError(
                f"writers={self.writers!r} must be a whole number >= 1", sink=self.name,
                fix="leave it unset (the executors' cores) or give the number of "
                "transactions that should write each batch")
        if self.overlap_commits is not None and not isinstance(self.overlap_commits, bool):
            raise ConfigurationError(
                f"overlap_commits={self.overlap_commits!r} must be True, False or None",
                sink=self.name, fix="leave it unset (None: on where the end of the query "
                "waits for the commit) or give True or False")
        if not self.lease_ttl_s > 0:
            raise ConfigurationError(f"lease_ttl_s={self.lease_ttl_s} must be > 0",
                                     sink=self.name)


def task_property(key: str) -> str | None:
    """The running Spark task's local property ``key`` (Spark puts there every setting
    the query's session sets); None outside a task, or where it is not set."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
        value = context.getLocalProperty(key) if context is not None else None
    except Exception:
        return None
    return str(value) if value else None
