"""One error hierarchy for sparkeos, grouped by what the caller should do.

``SparkEOSError``
    ``ConfigurationError``      fix the configuration; nothing was written.
        ``SchemaMismatchError`` the batch does not fit what the sink holds.
    ``RetriableError``          transient (unreachable system, timeout); restarting
                                the query re-runs the batch, nothing is lost.
        ``SparkStoppedError``   Spark's context stopped under work that needs tasks.
    ``TransactionAbortedError`` a batch failed before its decision; every transaction
                                of it was rolled back; a restart writes it again.
    ``AttemptFencedError``      this task attempt lost to another attempt of the same
                                task (or its batch is already settled); Spark
                                discards it, nothing of it becomes visible.
    ``CommitLogError``          the durable commit log is unreadable or owned by
                                another query; operator action needed.
        ``TransactionIdCollisionError``
        ``RecordExistsError``   a write-once record was written by someone else first.
        ``QueryRunningError``   the query holds the commit log's lease.
    ``BadMessageError``         a source message cannot be decoded; it was not
                                acknowledged, so the broker keeps it (nothing lost).
    ``ReplayMismatchError``     real-time mode: a replay's rows differ from the rows
                                committed at the same positions; exactly-once stops.
    ``DataLossError``           a decided transaction can no longer be committed.
                                Never swallowed: the query stops.

Every message names the sink, the batch and the transaction ID where known, and
ends with what the user can do about it.
"""

from __future__ import annotations

import re

_SECRETS = re.compile(r"(?i)\b(sig|signature|AccountKey|SharedAccessSignature)=[^&;\s'\"]+")


def redact_secrets(text: str) -> str:
    """``text`` with the secrets a store's client quotes masked: a SAS token's signature
    in a URL (Azure's clients quote the request's URL in their errors), an account key
    or SAS of a connection string."""
    return _SECRETS.sub(r"\1=***", text)


class SparkEOSError(Exception):
    """Root of every error raised by sparkeos. Its problem is said with the secrets a
    store's client may quote masked (``redact_secrets``): errors are logged and recorded
    in the commit log."""

    def __init__(
        self,
        problem: str,
        *,
        sink: str | None = None,
        batch_id: int | None = None,
        txn_id: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.problem = redact_secrets(problem)
        self.sink = sink
        self.batch_id = batch_id
        self.txn_id = txn_id
        self.fix = fix
        super().__init__(self._render())

    def _render(self) -> str:
        labelled = (("sink", self.sink), ("batch", self.batch_id), ("txn", self.txn_id))
        where = [f"{label}={value}" for label, value in labelled if value is not None]
        text = self.problem
        if where:
            text = f"[{' '.join(where)}] {text}"
        if self.fix:
            text = f"{text}\n  What to do: {self.fix}"
        return text

    def __reduce__(self) -> tuple[object, ...]:
        # Errors cross the Spark task/driver boundary by pickling; keyword-only
        # constructor arguments need an explicit reduce.
        return (
            _rebuild,
            (type(self), self.problem, self.sink, self.batch_id, self.txn_id, self.fix),
        )


def _rebuild(
    cls: type[SparkEOSError],
    problem: str,
    sink: str | None,
    batch_id: int | None,
    txn_id: str | None,
    fix: str | None,
) -> SparkEOSError:
    return cls(problem, sink=sink, batch_id=batch_id, txn_id=txn_id, fix=fix)


class ConfigurationError(SparkEOSError, ValueError):
    """Wrong or missing configuration, detected before anything was written."""


class SchemaMismatchError(ConfigurationError):
    """The DataFrame's schema does not fit the sink (or changed between batches)."""


class UnsupportedSparkError(ConfigurationError):
    """The running pyspark is not one sparkeos was proven on (or it calls a Python sink
    in a way sparkeos does not know)."""


class RetriableError(SparkEOSError):
    """A transient failure: the batch can be retried; nothing was lost or committed."""


class SparkStoppedError(RetriableError):
    """Spark's context stopped (``spark.stop()``, the application ended) under work that
    needs its tasks. Phase 2 of a decided batch then finishes in the driver's process
    (``core.snapshot.recovery``); anywhere else the query's restart does the work again."""


class TransactionAbortedError(SparkEOSError):
    """Phase 1 failed; every transaction of the batch was rolled back."""


class AttemptFencedError(SparkEOSError):
    """A task attempt found that another attempt owns its partition's outcome.

    Raised in tasks only: a speculative copy or a zombie that lost. Spark keeps the
    winning attempt's result; nothing this attempt wrote can become visible."""


class CommitLogError(SparkEOSError):
    """The commit log is unreadable, inconsistent or belongs to another query."""


class RecordExistsError(CommitLogError):
    """A write-once commit-log record already exists (another process wrote it)."""


class QueryRunningError(CommitLogError):
    """An operator command found the query's lease fresh: the query is running."""


class TransactionIdCollisionError(CommitLogError):
    """Two queries or sinks would use the same transaction IDs."""


class DataRejectedError(SparkEOSError):
    """The destination (or the sink's own rule) refused rows of the batch: a constraint
    violation, a bad value, a key repeated where one row per key is written.

    Raised in phase 1: the coordinator rolls back every transaction of the batch, so
    nothing of it is committed; restarting without fixing the cause fails again.
    """


class DataLossError(SparkEOSError):
    """A transaction recorded as decided can no longer be committed."""


class ReplayUndecidableError(SparkEOSError):
    """The replay rule cannot tell whether a decided participant's rows are the ones on
    record as committed (a receipt or marker without a fingerprint): under exactly-once
    the commit is refused rather than risk a duplicate or a loss (``core.snapshot.replay``)."""


class ReplayMismatchError(SparkEOSError):
    """A replay's rows differ from the rows committed at the same positions (real-time
    mode, ``core.snapshot.positions``): the pipeline does not give its writer partition
    the same rows in the same order again. Under exactly-once nothing more is written."""


_EXCEPTION_NAME = re.compile(r"[A-Za-z_][\w.]*")


def describe_cause(exc: BaseException, limit: int = 400) -> str:
    """A one-line summary of ``exc``; Spark's task errors carry a whole JVM trace."""
    text = str(exc).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in lines:
        head = line.split(":", 1)[0]
        # An exception's name (dotted, no spaces): not a traceback's source line such as
        # "except FileNotFoundError:".
        if (_EXCEPTION_NAME.fullmatch(head) and head.endswith(("Error", "Exception"))
                and not head.endswith(".PythonException")):
            return line[:limit]
    summary = lines[0] if lines else ""
    return f"{type(exc).__name__}: {summary}"[:limit]


def cause_fix(exc: BaseException) -> str | None:
    """The advice a sparkeos error raised in a task carries, also when it reaches the
    driver as the text of Spark's own exception."""
    if isinstance(exc, SparkEOSError):
        return exc.fix
    marker = "What to do: "
    for line in str(exc).splitlines():
        if marker in line:
            return line.split(marker, 1)[1].strip() or None
    return None


class BadMessageError(SparkEOSError):
    """A source message cannot be decoded (a poison message). It was not acknowledged:
    the broker keeps it, nothing is lost; the error names its ID and the options."""
