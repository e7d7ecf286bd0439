"""One place that turns confluent-kafka / librdkafka errors into sparkeos errors.

=========================================  ===============================================
Kafka error                                sparkeos error
=========================================  ===============================================
fenced (``_FENCED``, ``PRODUCER_FENCED``,  ``AttemptFencedError`` in phase 1 (a newer
``INVALID_PRODUCER_EPOCH``, ...; also      attempt took the transactional ID over);
behind ``_FATAL``, see ``underlying``)
                                           ``RetriableError`` in phase 2 / recovery (the
                                           batch is decided; a restart finishes it)
``INVALID_TRANSACTION_TIMEOUT``            ``ConfigurationError`` (lower the timeout or
                                           raise the broker's maximum)
authentication / authorization / SSL,      ``ConfigurationError`` (credentials, ACLs)
invalid configuration, unknown topic,
message too large
retriable, timeouts, transport,            ``RetriableError``
coordinator moves, "abortable" errors
anything else                              ``RetriableError`` (phase 2) or
                                           ``TransactionAbortedError`` (phase 1)
=========================================  ===============================================

Messages name the sink, the batch, the transactional ID and what to do; they never
contain configuration values (secrets stay out of logs and the commit log). ``failed``
is ``translate`` for a sink's participant; ``is_retriable`` / ``requires_abort`` /
``is_fenced`` / ``is_permanent`` / ``underlying`` classify errors for the retry policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sparkeos.core.errors import (
    AttemptFencedError,
    ConfigurationError,
    RetriableError,
    SparkEOSError,
    TransactionAbortedError,
)
from sparkeos.core.protocol import Transaction

if TYPE_CHECKING:
    from .config import KafkaConfig

PHASE1 = "phase 1"
PHASE2 = "phase 2"
DRIVER = "driver"

_FENCED = {"_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH",
           "TRANSACTION_COORDINATOR_FENCED", "INVALID_PRODUCER_ID_MAPPING"}
_AUTH = {"SASL_AUTHENTICATION_FAILED", "_AUTHENTICATION", "_SSL",
         "TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED",
         "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED",
         "UNSUPPORTED_SASL_MECHANISM", "ILLEGAL_SASL_STATE"}
_CONFIG = {"_INVALID_ARG", "INVALID_CONFIG", "_UNKNOWN_TOPIC", "UNKNOWN_TOPIC_OR_PART",
           "MSG_SIZE_TOO_LARGE", "_MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE",
           "INVALID_REPLICATION_FACTOR", "POLICY_VIOLATION", "_NOT_CONFIGURED",
           "_UNSUPPORTED_FEATURE", "UNSUPPORTED_VERSION", "INVALID_TOPIC_EXCEPTION",
           "TOPIC_EXCEPTION", "INVALID_REQUIRED_ACKS"}
_RETRIABLE = {"_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_MSG_TIMED_OUT",
              "_TIMED_OUT_QUEUE", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION",
              "NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE", "COORDINATOR_LOAD_IN_PROGRESS",
              "CONCURRENT_TRANSACTIONS", "LEADER_NOT_AVAILABLE", "NOT_LEADER_FOR_PARTITION",
              "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
              "UNSTABLE_OFFSET_COMMIT", "BROKER_NOT_AVAILABLE", "_RESOLVE", "_QUEUE_FULL",
              "KAFKA_STORAGE_ERROR", "TRANSACTION_ABORTABLE", "_WAIT_COORD", "_RETRY",
              "_PURGE_QUEUE", "_PURGE_INFLIGHT", "_DESTROY", "REBOOTSTRAP_REQUIRED"}


def error_name(exc: BaseException) -> str | None:
    """The librdkafka error name of a KafkaException (``_FENCED``...), else None."""
    err = _kafka_error(exc)
    if err is None:
        return None
    try:
        return str(err.name())
    except Exception:
        return None


def underlying(producer: Any, exc: BaseException) -> BaseException:
    """The error behind a ``_FATAL`` one. librdkafka reports a producer's fatal error
    (e.g. fencing by a newer attempt) as ``_FATAL: Local: Fatal error`` from the call
    that hit it; serving the producer's events raises the original error instead."""
    if producer is None or error_name(exc) != "_FATAL":
        return exc
    try:
        producer.poll(0)
    except Exception as original:
        if _kafka_error(original) is not None:
            return original
    return exc


def is_fenced(exc: BaseException) -> bool:
    return error_name(exc) in _FENCED


def is_retriable(exc: BaseException) -> bool:
    err = _kafka_error(exc)
    if err is None:
        return False
    try:
        if err.fatal():
            return False
        return bool(err.retriable()) or str(err.name()) in _RETRIABLE - {"TRANSACTION_ABORTABLE"}
    except Exception:
        return False


def is_permanent(exc: BaseException) -> bool:
    """An error that the same call cannot get past by trying again: configuration,
    credentials, a record the topic refuses (``MSG_SIZE_TOO_LARGE`` is also
    "abortable": the transaction must be aborted, but every new one fails alike).
    One that librdkafka marks retriable is not."""
    name = error_name(exc)
    if name not in _CONFIG and name not in _AUTH and name != "INVALID_TRANSACTION_TIMEOUT":
        return False
    try:
        return not _kafka_error(exc).retriable()  # librdkafka's word first
    except Exception:
        return True


def requires_abort(exc: BaseException) -> bool:
    err = _kafka_error(exc)
    try:
        return bool(err is not None and err.txn_requires_abort())
    except Exception:
        return False


def _kafka_error(exc: BaseException) -> Any:
    args = getattr(exc, "args", ())
    if args and hasattr(args[0], "code") and hasattr(args[0], "name"):
        return args[0]
    return None


def translate(
    exc: BaseException,
    *,
    sink: str | None,
    txn: Transaction | None,
    phase: str,
    bootstrap: str,
    action: str,
    transactional_id: str | None = None,
) -> SparkEOSError:
    """The sparkeos error for ``exc`` raised while doing ``action``.

    ``phase``: ``PHASE1`` (a task writing a not yet decided batch), ``PHASE2`` (commit
    of a decided batch, also during recovery) or ``DRIVER`` (validation, rollback).
    """
    if isinstance(exc, SparkEOSError):
        return exc
    where: dict[str, Any] = {
        "sink": sink or (txn.sink if txn else None),
        "batch_id": txn.batch_id if txn else None,
        "txn_id": transactional_id or (txn.txn_id if txn else None),
    }
    err = _kafka_error(exc)
    name = error_name(exc) or type(exc).__name__
    detail = str(err.str()) if err is not None and hasattr(err, "str") else str(exc)
    detail = detail.strip() or name
    problem = f"Kafka {action} failed on {bootstrap}: {name}: {detail}"
    return _classify(exc, name, problem, phase, bootstrap, where)


def failed(config: KafkaConfig, exc: BaseException, txn: Transaction, phase: str,
           action: str) -> SparkEOSError:
    """``translate`` for a participant of the sink configured by ``config``."""
    return translate(exc, sink=txn.sink, txn=txn, phase=phase, bootstrap=config.bootstrap,
                     action=action, transactional_id=config.transactional_id(txn))


def _classify(exc: BaseException, name: str, problem: str, phase: str, bootstrap: str,
              where: dict[str, Any]) -> SparkEOSError:
    """The table of the module docstring, row by row."""
    decided_note = ("the batch is decided, so it will be committed, not lost"
                    if phase == PHASE2 else "nothing of this batch became visible")
    if name == "INVALID_TRANSACTION_TIMEOUT":
        return ConfigurationError(
            problem, **where,
            fix="lower KafkaSink(transaction_timeout_ms=...) to at most the broker's "
            "transaction.max.timeout.ms (default 900000), or raise that broker setting",
        )
    if name in _FENCED:
        return _fenced(problem, phase, decided_note, where)
    if name in _AUTH:
        return ConfigurationError(
            problem, **where,
            fix="check the credentials in producer_config (security.protocol, sasl.*, ssl.*) "
            "and the ACLs: WRITE and DESCRIBE on the output topics, READ on the marker "
            "topic and on the marker consumer groups (marker_group_prefix), WRITE and "
            "DESCRIBE on the transactional IDs (transactional_id_prefix + 'seos-'), "
            f"IDEMPOTENT_WRITE on the cluster; {decided_note}",
        )
    if name in _CONFIG:
        return ConfigurationError(problem, **where, fix=f"{_config_fix(name)}; {decided_note}")
    if is_retriable(exc) or requires_abort(exc) or name in _RETRIABLE or isinstance(
            exc, (BufferError, TimeoutError, ConnectionError)):
        return RetriableError(
            f"{problem} (transient); {decided_note}", **where,
            fix=f"check that the brokers at {bootstrap} are up and reachable; restarting the "
            "query re-runs the batch (or finishes its commits) without loss or duplicates",
        )
    if phase == PHASE1:
        return TransactionAbortedError(
            f"{problem}; {decided_note}", **where,
            fix="fix the cause above and restart the query; the batch is written again",
        )
    return RetriableError(
        f"{problem}; {decided_note}", **where,
        fix="fix the cause above and restart the query (or run `sparkeos recover`)",
    )


def _fenced(problem: str, phase: str, decided_note: str,
            where: dict[str, Any]) -> SparkEOSError:
    text = (f"{problem}; this attempt was fenced by a newer attempt: another producer "
            "initialised the same transactional.id (a newer attempt of this task, a "
            "restarted query, or a second query using the same sink name and "
            "checkpoint)")
    if phase == PHASE1:
        return AttemptFencedError(
            text, **where,
            fix="usually nothing: the newer attempt owns the transaction and Spark "
            "keeps its result; if two queries share a transactional ID, give each its "
            "own sink name or transactional_id_prefix",
        )
    return RetriableError(
        f"{text}; {decided_note}", **where,
        fix="restart the query (or wait for the other attempt to finish); if two "
        "queries share a transactional ID, give each its own sink name",
    )


def _config_fix(name: str) -> str:
    if "TOPIC" in name:
        return ("create the topic (or enable auto.create.topics.enable on the broker), or "
                "fix KafkaSink(topic=...) / the topic column")
    if "SIZE" in name or "LARGE" in name:
        return ("raise message.max.bytes in producer_config and max.message.bytes on the "
                "topic, or write smaller records")
    return "check the KafkaSink settings and producer_config"


def short(exc: BaseException) -> str:
    """``exc`` in one line, for messages about a check that could not run."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
