"""What the conformance suite's case modules share: the crash points and settings of
the matrix, the replay rule's message and the exactly-once check. It imports none of
the case modules (``cases``, ``races``, ``replays``, ``variants``), which all import it.
"""

from __future__ import annotations

from collections import Counter

BEFORE_DECISION = ("after_begun", "after_all_prepared", "kill_driver_after_first_prepare")
AFTER_ALL_COMMITS = ("after_all_commits", "after_finished")
OVERLAP_POINTS = ("after_first_commit", "after_finished")
"""Points of phase 2, which ``overlap_commits`` runs in the background: among the
commits and after the last record (``after_all_commits`` differs from the latter only
by the ``finished`` record; ``tests/core/snapshot/test_overlap.py`` crashes at every point)."""
CRASH_BATCH = 1
SPECULATION_CONF = {
    "spark.speculation": "true",
    "spark.speculation.interval": "100ms",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.minTaskRuntime": "100ms",
    "spark.speculation.efficiency.enabled": "false",
    "spark.executor.memory": "1g",
    "spark.task.maxFailures": "4",
}
"""Speculate as soon as one of the two tasks of a stage finished."""

REPLAY_RULE = (
    "the replay rule (docs/writing-a-connector.md, 'Replays'; CHANGELOG.md, "
    "'Connector contract'): a "
    "participant of a replay may write nothing only when what was committed for its "
    "(batch, partition) holds the same rows (core.snapshot.fingerprint.Written); a marker alone "
    "says nothing about the rows of a replay partitioned otherwise")


def assert_exactly_once(visible: list[int], expected: list[int]) -> None:
    counts = Counter(visible)
    duplicates = sorted(i for i, n in counts.items() if n > 1)
    missing = sorted(set(expected) - set(counts))
    unexpected = sorted(set(counts) - set(expected))
    assert not duplicates and not missing and not unexpected, (
        f"duplicates={duplicates[:20]} (total {len(duplicates)}), "
        f"missing={missing[:20]} (total {len(missing)}), unexpected={unexpected[:20]}"
    )


__all__ = ["AFTER_ALL_COMMITS", "BEFORE_DECISION", "CRASH_BATCH", "OVERLAP_POINTS",
           "REPLAY_RULE", "SPECULATION_CONF", "assert_exactly_once"]


def assert_visible_after_kill(visible: list[int], point: str, earlier: list[int],
                              through_killed: list[int]) -> None:
    """What a reader may see right after the driver was killed at ``point`` of a batch
    (``earlier``: the ids of the batches before it; ``through_killed``: with its own): no
    id twice, every earlier batch exactly once, nothing of the killed batch before its
    decision (invariant 1), all of it after its commits."""
    assert len(visible) == len(set(visible)), f"an id visible twice after {point}"
    if point in BEFORE_DECISION:
        assert_exactly_once(visible, earlier)
    elif point in AFTER_ALL_COMMITS:  # the kill really came after the commits
        assert_exactly_once(visible, through_killed)
    else:
        known = set(earlier)
        assert_exactly_once([i for i in visible if i in known], earlier)
