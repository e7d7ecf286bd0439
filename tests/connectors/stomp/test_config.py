"""StompSink / stomp_source settings: validated at construction, secrets never shown."""

from __future__ import annotations

import os
import pickle

import pytest

from sparkeos.connectors.stomp import StompSink, StompSourceConfig
from sparkeos.connectors.stomp.client import Endpoint, broker_kind, redact_url
from sparkeos.core.config import Guarantee
from sparkeos.core.errors import ConfigurationError

URL = "stomp://app:s3cret-canary@broker.example:61613"


def test_the_url_names_host_port_login_and_tls() -> None:
    endpoint = Endpoint.parse("stomp+ssl://a%40b:p%3Aw@h:1234?vhost=/")
    assert (endpoint.host, endpoint.port, endpoint.login, endpoint.passcode) == (
        "h", 1234, "a@b", "p:w")
    assert endpoint.ssl and endpoint.vhost == "/"
    assert Endpoint.parse("stomp://h").port == 61613


@pytest.mark.parametrize("url", ["broker:61613", "http://h:1", "stomp://h:1?tls=1",
                                 "stomp://:1"])
def test_a_bad_url_is_refused_without_echoing_a_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Endpoint.parse(url)
    assert "What to do" in str(info.value)


def test_passwords_are_never_shown() -> None:
    sink = StompSink(URL, destination="out")
    shown = repr(sink) + str(sink.describe()) + repr(pickle.loads(pickle.dumps(sink)))
    assert "s3cret-canary" not in shown and "app:***@" in shown
    source = StompSourceConfig(URL, "in")
    assert "s3cret-canary" not in repr(source)
    assert redact_url(URL) == "stomp://app:***@broker.example:61613"


def test_a_recorded_sink_without_its_passcode_cannot_be_rebuilt() -> None:
    description = StompSink(URL, destination="out").describe()
    with pytest.raises(ConfigurationError, match="omits its passcode"):
        StompSink.from_description(description)
    rebuilt = StompSink.from_description(
        StompSink("stomp://h:1", destination="out").describe())
    assert rebuilt.endpoint.address == "h:1"
    # `sparkeos recover --set passcode=...` gives it (it was refused even then before)
    with_passcode = StompSink.from_description({**description, "passcode": "s3cret-canary"})
    assert with_passcode.endpoint.passcode == "s3cret-canary"


def test_on_a_cluster_the_source_refuses_a_spool_in_the_home_directory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Executors read the spool: this host's home directory is not theirs."""
    from sparkeos.connectors.stomp import stomp_source

    class ClusterSession:
        class sparkContext:
            master = "spark://127.0.0.1:7077"

    monkeypatch.delenv("SPARKEOS_STOMP_SPOOL_DIR", raising=False)
    with pytest.raises(ConfigurationError, match="runs on a cluster") as info:
        stomp_source(ClusterSession(), URL, "in")
    assert "spool_dir" in str(info.value) and "s3cret-canary" not in str(info.value)


@pytest.mark.parametrize(("settings", "match"), [
    ({}, "destination"),
    ({"destination": "q", "duplicate_detection": "maybe"}, "duplicate_detection"),
    ({"destination": "q", "body_format": "string"}, "needs a body_column"),
    ({"destination": "q", "headers": {"_AMQ_DUPL_ID": "x"}}, "manages"),
    ({"destination": "q", "id_cache_size": 0}, "id_cache_size"),
])
def test_sink_settings_are_checked_at_construction(settings: dict[str, object],
                                                   match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        StompSink(URL, **settings)  # type: ignore[arg-type]


def test_without_duplicate_detection_only_at_least_once_is_offered() -> None:
    sink = StompSink(URL, destination="q", duplicate_detection="none")
    assert Guarantee.EXACTLY_ONCE not in sink.guarantees
    assert Guarantee.EXACTLY_ONCE in StompSink(URL, destination="q").guarantees


def test_a_batch_larger_than_the_duplicate_id_cache_is_refused_before_the_decision() -> None:
    sink = StompSink(URL, destination="q", id_cache_size=100)
    sink.before_decision(3, [{"destinations": {"q": 60}}, {"destinations": {"r": 60}}])
    with pytest.raises(ConfigurationError, match=r"batch 3 would send 120 messages to 'q'"):
        sink.before_decision(3, [{"destinations": {"q": 60}}, {"destinations": {"q": 60}}])
    consumer = StompSink(URL, destination="q", id_cache_size=100,
                         duplicate_detection="consumer")
    consumer.before_decision(3, [{"destinations": {"q": 600}}])  # consumers deduplicate


@pytest.mark.parametrize(("settings", "match"), [
    ({"body_format": "xml"}, "body_format"),
    ({"on_bad_message": "drop"}, "on_bad_message"),
    ({"on_bad_message": "dead-letter"}, "needs a destination"),
    ({"max_batch_messages": 0}, "max_batch_messages"),
    ({"max_seen_ids": 10}, "max_seen_ids"),
    ({"name": "a/b"}, "invalid source name"),
])
def test_source_settings_are_checked_at_construction(settings: dict[str, object],
                                                     match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        StompSourceConfig(URL, "in", **settings)  # type: ignore[arg-type]


def test_source_options_round_trip_through_spark_options() -> None:
    config = StompSourceConfig(URL, "in", message_id_fn=lambda h: h.get("k"))
    again = StompSourceConfig.from_options({"secret_config": config.encode()})
    assert again.message_id_fn is not None and again.message_id_fn({"k": "v"}) == "v"
    plain = StompSourceConfig.from_options({"url": URL, "destination": "in",
                                            "max_batch_messages": "7", "fsync": "false"})
    assert plain.max_batch_messages == 7 and plain.fsync is False
    with pytest.raises(ConfigurationError, match="unknown option"):
        StompSourceConfig.from_options({"url": URL, "destination": "in", "colour": "red"})


@pytest.mark.parametrize(("server", "kind"), [
    ("ActiveMQ-Artemis/2.56.0 ActiveMQ Artemis Messaging Engine", "artemis"),
    ("ActiveMQ/5.17.2", "activemq"), ("RabbitMQ/3.10.8", "rabbitmq"), (None, "other")])
def test_the_broker_kind_comes_from_the_server_header(server: str | None, kind: str) -> None:
    assert broker_kind(server) == kind


def test_staging_may_be_on_hdfs_or_an_object_store(monkeypatch):
    """Staging and the PUBLISHED records go through core.storage.files: a POSIX path is made
    absolute, an object store's URI kept (no shared mount needed, none checked)."""
    from sparkeos.connectors.stomp import StompSink
    from sparkeos.core.storage.stores.s3 import S3Files

    monkeypatch.delenv("SPARKEOS_WEBHDFS_PORT", raising=False)
    on_s3 = StompSink("stomp://h:61613", destination="q", staging_dir="s3a://lake/stomp/")
    assert isinstance(on_s3.staging.files, S3Files) and not on_s3.shared_paths()
    assert on_s3.staging.root == "s3a://lake/stomp"
    on_hdfs = StompSink("stomp://h:61613", destination="q", staging_dir="hdfs://nn:8020/s")
    assert on_hdfs.staging.root == "webhdfs://nn:9870/s"
    local = StompSink("stomp://h:61613", destination="q", staging_dir="rel/dir")
    assert local.staging.root == os.path.abspath("rel/dir") and local.shared_paths()
