"""Structured logging and per-batch metrics."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

logger = logging.getLogger("sparkeos")


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``event`` with key=value context; the fields are also on ``record.sparkeos``."""
    if not logger.isEnabledFor(level):
        return
    text = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
    logger.log(level, "%s %s", event, text, extra={"sparkeos": {"event": event, **fields}})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the sparkeos fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(getattr(record, "sparkeos", {}))
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def enable_json_logging(level: int = logging.INFO) -> logging.Handler:
    """Send sparkeos logs as JSON lines to stderr (a convenience for jobs)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler


@dataclass
class BatchMetrics:
    """What one batch cost. ``outcome`` is one of:

    ``committed`` (written and committed now), ``decided`` (``overlap_commits``: its
    phase 2 runs in the background; ``committed`` once it ended), ``replayed`` (a
    re-run of a batch already decided: only its commits were finished, nothing new
    written), ``aborted``,
    ``direct`` (at-least-once / none: committed by each task).
    """

    query_key: str
    sink: str
    batch_id: int
    guarantee: str
    outcome: str = "committed"
    run: int = 0
    """The batch attempt (``begun.<run>``): above 0 after a failed or crashed attempt."""
    rows: int = 0
    partitions: int = 0
    prepare_ms: float = 0.0
    decide_ms: float = 0.0
    commit_ms: float = 0.0
    total_ms: float = 0.0
    recover_ms: float = 0.0
    """Time spent finishing earlier batches (``recovered``) before this one."""
    wait_ms: float = 0.0
    """Time this batch waited for an earlier batch's background phase 2
    (``overlap_commits``)."""
    visible_ms: float = 0.0
    """From the batch's start until its records were committed: ``total_ms``, or
    later with ``overlap_commits`` (phase 2 then ends after the batch returned)."""
    recovered: list[dict[str, Any]] = field(default_factory=list)
    replays_skipped: int = 0
    """Participants that found their (batch, partition) committed by an earlier run with
    the same rows, and wrote nothing."""
    replays_rewritten: int = 0
    """Participants that found their (batch, partition) committed by an earlier run with
    other rows (a replay partitioned otherwise): written again, reported as
    ``replay.nondeterministic``."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
