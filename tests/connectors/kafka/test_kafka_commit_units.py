"""What a merged Kafka commit needs that no broker shows: how a batch's receipts are
grouped into transactions, and marker consumers that stay open while a commit holds
them."""

from __future__ import annotations

from typing import Any

import pytest

from sparkeos.connectors.kafka import KafkaSink, clients


def sink(**overrides: Any) -> KafkaSink:
    return KafkaSink(**{"bootstrap_servers": "127.0.0.1:9", "topic": "out",
                        "staging_dir": "/tmp/sparkeos-unused", **overrides})


def staged(mb: float) -> dict[str, Any]:
    return {"mode": "staged", "rows": 10, "bytes": int(mb * 1e6), "file": "f"}


def test_receipts_merge_into_contiguous_runs_of_the_committers() -> None:
    receipts = [staged(1)] * 8
    assert sink().commit_groups(receipts, 4) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert sink().commit_groups(receipts[:3], 4) == [0, 1, 2]  # no more than committers


def test_a_run_is_cut_where_one_transaction_would_outlast_the_publish_budget() -> None:
    """8 participants of 40 MB, 2 committers: the budget of one transaction (0.8 x 60 s
    at 1 MB/s = 48 MB) holds one participant, so each commits alone, where 4 x 40 MB in
    one transaction would be aborted by the broker on every retry."""
    big = [staged(40)] * 8
    assert sink().commit_groups(big, 2) == list(range(8))
    mixed = [staged(20), staged(20), staged(20), staged(1), staged(1), staged(1)]
    assert sink().commit_groups(mixed, 1) == [0, 0, 1, 1, 1, 1]
    assert sink(transaction_timeout_ms=900_000).commit_groups(big, 2) == [0] * 4 + [1] * 4


def test_a_held_marker_consumer_outlives_its_eviction() -> None:
    """A commit of many participants holds more marker groups than the cache keeps:
    one evicted while held is closed by its holder, not under it."""
    config = sink().client_config()
    try:
        with clients.held_marker_consumer(config, "sparkeos-test-held") as held:
            for i in range(clients._MAX_CACHED + 2):
                clients.marker_consumer(config, f"sparkeos-test-other-{i}")
            assert held.consumer_group_metadata()  # still open
        with pytest.raises(RuntimeError, match="closed"):
            held.consumer_group_metadata()
    finally:
        clients.clear_caches()


def _refused(name: str, *, abortable: bool = False, retriable: bool = False) -> Exception:
    from confluent_kafka import KafkaError, KafkaException

    return KafkaException(KafkaError(getattr(KafkaError, name), f"{name} here",
                                     retriable=retriable, txn_requires_abort=abortable))


@pytest.mark.parametrize("name", ["MSG_SIZE_TOO_LARGE", "TOPIC_AUTHORIZATION_FAILED"])
def test_a_refused_commit_is_not_tried_again_and_names_its_cause(
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """A record the topic refuses makes the transaction "abortable", but every new
    try fails alike: one try, and the error names the refusal (a later try's
    different failure, such as a marker read timing out, would hide it)."""
    from sparkeos.connectors.kafka import publish
    from sparkeos.core.errors import ConfigurationError
    from sparkeos.core.snapshot.txpool import TransactionPool

    tries = []

    def refuse(*args: Any) -> None:
        tries.append(args)
        raise _refused(name, abortable=True)

    monkeypatch.setattr(publish, "publish", refuse)
    txn = TransactionPool("q", "out").transaction(1, 0, 0, 0)
    with pytest.raises(ConfigurationError, match=name):
        publish.commit_unit(sink(), [(txn, staged(1))], recovering=False)
    assert len(tries) == 1


def test_a_transient_commit_failure_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkeos.connectors.kafka import publish
    from sparkeos.connectors.kafka import staged as staged_files
    from sparkeos.core.snapshot.txpool import TransactionPool

    tries = []

    def flaky(*args: Any) -> None:
        tries.append(args)
        if len(tries) == 1:
            raise _refused("NOT_COORDINATOR", retriable=True)

    monkeypatch.setattr(publish, "publish", flaky)
    monkeypatch.setattr(publish.time, "sleep", lambda s: None)
    monkeypatch.setattr(staged_files, "staging_area", lambda config: _NoStaging())
    txn = TransactionPool("q", "out").transaction(1, 0, 0, 0)
    publish.commit_unit(sink(), [(txn, staged(1))], recovering=False)
    assert len(tries) == 2


class _NoStaging:
    def delete(self, txn: Any) -> None:
        pass


def test_a_refusal_through_a_kept_producer_is_not_tried_with_a_fresh_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer kept from an earlier batch that fails is replaced by a fresh one, but
    not for a refusal: the fresh one would fail alike and could hide why."""
    from sparkeos.connectors.kafka import producers, publish
    from sparkeos.core.snapshot.txpool import TransactionPool

    fresh = []
    monkeypatch.setattr(producers, "phase2_producer", lambda *a: (object(), True))
    monkeypatch.setattr(producers, "init_producer", lambda *a: fresh.append(a))

    def refuse(*args: Any) -> None:
        raise _refused("MSG_SIZE_TOO_LARGE", abortable=True)

    monkeypatch.setattr(publish, "_publish_with", refuse)
    txn = TransactionPool("q", "out").transaction(1, 0, 0, 0)
    with pytest.raises(Exception, match="MSG_SIZE_TOO_LARGE"):
        publish.publish(sink(), [(txn, staged(1))], False)
    assert fresh == []


def test_a_refusal_librdkafka_marks_retriable_is_not_permanent() -> None:
    from sparkeos.connectors.kafka.errors import is_permanent

    assert is_permanent(_refused("UNKNOWN_TOPIC_OR_PART"))
    assert not is_permanent(_refused("UNKNOWN_TOPIC_OR_PART", retriable=True))
    assert not is_permanent(_refused("NOT_COORDINATOR", retriable=True))
