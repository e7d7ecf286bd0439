"""Where the object stores are, for processes without a Spark session: the settings a
format carries (issue 37, item 3). The format route end to end on S3 with the endpoint
only in Spark's own setting: integration/connectors/file/test_file_conformance.py."""

from __future__ import annotations

import contextvars
import dataclasses
import socket
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark import cloudpickle

from sparkeos.core.errors import ConfigurationError, RetriableError, SparkEOSError
from sparkeos.core.faults import FaultPlan
from sparkeos.core.snapshot.recovery import Recovery
from sparkeos.core.storage.registry import split_uri
from sparkeos.core.storage.stores import s3 as s3_store
from sparkeos.core.storage.stores import settings
from sparkeos.core.storage.stores.azure import AzureBlobFiles
from sparkeos.core.storage.stores.gcs import GcsFiles
from sparkeos.core.storage.stores.s3 import S3Files
from sparkeos.formats import _carrying, format_classes


def test_only_locations_are_taken_never_credentials():
    found = settings.location_settings({
        "spark.hadoop.fs.s3a.endpoint": "http://store:9000",
        "spark.hadoop.fs.s3a.bucket.lake.endpoint": "http://lake:9000",
        "fs.s3a.endpoint.region": "eu-west-1",
        "spark.hadoop.fs.gs.storage.root.url": "http://gcs:4443",
        "spark.hadoop.fs.s3a.secret.key": "canary",
        "spark.hadoop.fs.s3a.access.key": "canary",
        "spark.hadoop.fs.s3a.bucket.lake.secret.key": "canary",
        "spark.sql.shuffle.partitions": "4"})
    assert found == {"fs.s3a.endpoint": "http://store:9000",
                     "fs.s3a.bucket.lake.endpoint": "http://lake:9000",
                     "fs.s3a.endpoint.region": "eu-west-1",
                     "fs.gs.storage.root.url": "http://gcs:4443"}


def test_an_s3_store_finds_the_endpoint_a_format_carries(monkeypatch):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    assert S3Files.from_environment("s3a", "lake").endpoint is None  # Amazon S3
    with settings.using({"fs.s3a.endpoint": "store:9000",
                         "fs.s3a.connection.ssl.enabled": "false",
                         "fs.s3a.endpoint.region": "eu-west-1"}):
        files = S3Files.from_environment("s3a", "lake")
        with settings.using({"fs.s3a.bucket.lake.endpoint": "https://lake:9443"}):
            per_bucket = S3Files.from_environment("s3a", "lake")
    assert (files.endpoint, files.region) == ("http://store:9000", "eu-west-1")
    assert per_bucket.endpoint == "https://lake:9443"
    assert S3Files.from_environment("s3a", "lake").endpoint is None  # the block ended
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://env:9000")
    with settings.using({"fs.s3a.endpoint": "http://store:9000"}):
        assert S3Files.from_environment("s3a", "lake").endpoint == "http://env:9000"


def test_the_threads_a_block_starts_see_its_settings_and_none_remain_after_it():
    """Phase 2 commits on threads of its own inside the committer's block."""
    seen = []
    with settings.using({"fs.s3a.endpoint": "http://store:9000"}):
        thread = threading.Thread(target=lambda: seen.append(
            settings.hadoop_setting("fs.s3a.endpoint")))
        thread.start()
        thread.join()
    assert seen == ["http://store:9000"]
    assert settings.hadoop_setting("fs.s3a.endpoint") is None


def test_registered_formats_carry_the_session_s_locations_by_value():
    """Spark pickles a registered data source with cloudpickle and unpickles it in
    workers without a session: the class made at registration travels by value, with
    the locations; its format name is the format's."""
    session = SimpleNamespace(conf=SimpleNamespace(getAll={
        "spark.hadoop.fs.s3a.endpoint": "http://store:9000",
        "spark.hadoop.fs.s3a.secret.key": "canary"}))
    locations = settings.captured_from(session)
    assert locations == {"fs.s3a.endpoint": "http://store:9000"}
    original = format_classes()[0]
    carried = cloudpickle.loads(cloudpickle.dumps(_carrying(original, locations)))
    assert carried.name() == original.name() and issubclass(carried, original)
    assert carried.store_locations == locations and original.store_locations == {}
    assert "canary" not in repr(cloudpickle.dumps(_carrying(original, locations)))
    source = carried(options={"path": "s3a://lake/out",
                              "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1"})
    assert source._locations() == {"fs.s3a.endpoint": "http://store:9000",
                                   "fs.s3a.endpoint.region": "eu-west-1"}


# -- per-bucket settings as Hadoop reads them (issue 48, defect 6) -------------------------
DOTTED = {
    "spark.hadoop.fs.s3a.endpoint": "http://generic:9000",
    "spark.hadoop.fs.s3a.bucket.my.data.endpoint": "dotted:9443",
    "spark.hadoop.fs.s3a.bucket.my.data.connection.ssl.enabled": "false",
    "spark.hadoop.fs.s3a.bucket.my.data.endpoint.region": "eu-north-1",
    "spark.hadoop.fs.s3a.bucket.my.data.secret.key": "canary",
    "spark.hadoop.fs.s3a.bucket.my.data.access.key": "canary",
    "spark.hadoop.fs.s3a.bucket.my.data.session.token": "canary"}


def test_a_dotted_bucket_s_own_settings_are_carried_and_read_for_that_bucket_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Hadoop looks up ``fs.s3a.bucket.<bucket>.<option>`` for the bucket it opens
    (``S3AUtils.propagateBucketOptions``): ``my.data``'s endpoint, TLS and region are
    its own; ``my`` and ``data`` get the generic ones. Never a secret."""
    _no_endpoint_env(monkeypatch)
    carried = settings.location_settings(DOTTED)
    assert carried == {"fs.s3a.endpoint": "http://generic:9000",
                       "fs.s3a.bucket.my.data.endpoint": "dotted:9443",
                       "fs.s3a.bucket.my.data.connection.ssl.enabled": "false",
                       "fs.s3a.bucket.my.data.endpoint.region": "eu-north-1"}
    source = format_classes()[0](options={"path": "s3a://my.data/out", **DOTTED})
    assert source._locations() == carried  # a format's options of the same names
    with settings.using(carried):
        dotted = S3Files.from_environment("s3a", "my.data")
        others = [S3Files.from_environment("s3a", b) for b in ("my", "data", "my.data.x")]
    assert (dotted.endpoint, dotted.region) == ("http://dotted:9443", "eu-north-1")
    assert "spark.hadoop.fs.s3a.bucket.my.data.endpoint" in dotted.endpoint_from
    assert [(f.endpoint, f.region) for f in others] == [
        ("http://generic:9000", "us-east-1")] * 3


def test_an_s3a_option_resolves_as_hadoop_resolves_it() -> None:
    with settings.using({"fs.s3a.endpoint.region": "eu-west-1",
                         "fs.s3a.bucket.a.b.endpoint.region": "ap-south-1",
                         "fs.s3a.bucket.a.endpoint": "http://a:1"}):
        own = settings.s3a_setting("a.b", "endpoint.region")
        generic = settings.s3a_setting("a", "endpoint.region")
        assert settings.s3a_setting("a.b", "endpoint") is None  # not bucket a's "b.endpoint"
    assert own is not None and own.value == "ap-south-1"
    assert own.name == "fs.s3a.bucket.a.b.endpoint.region" and own.place == settings.CARRIED
    assert generic is not None and generic.value == "eu-west-1"
    assert not settings.is_location_setting("fs.s3a.bucket..endpoint")
    assert not settings.is_location_setting("fs.s3a.bucket.endpoint")


# -- carried settings belong to the block that carries them ---------------------------------
def test_blocks_of_two_queries_interleaved_in_one_process_never_see_each_other() -> None:
    """Query A's format call opens its block, query B's opens its own, A's ends first:
    B keeps its own endpoint until its block ends, and nothing remains after both."""
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, list[str | None]] = {"a": [], "b": []}

    def query_a() -> None:
        with settings.using({"fs.s3a.endpoint": "http://a:9000"}):
            a_in.set()
            b_in.wait()
            seen["a"].append(settings.hadoop_setting("fs.s3a.endpoint"))
        a_out.set()

    def query_b() -> None:
        a_in.wait()
        with settings.using({"fs.s3a.endpoint": "http://b:9000"}):
            b_in.set()
            a_out.wait()
            seen["b"].append(settings.hadoop_setting("fs.s3a.endpoint"))
            with pytest.raises(KeyError), settings.using({"fs.s3a.endpoint": "http://c:1"}):
                raise KeyError("a failing call inside")
            seen["b"].append(settings.hadoop_setting("fs.s3a.endpoint"))

    _run_threads(query_a, query_b)
    assert seen == {"a": ["http://a:9000"], "b": ["http://b:9000", "http://b:9000"]}
    assert settings.hadoop_setting("fs.s3a.endpoint") is None
    assert settings._open == {}


def test_a_thread_without_a_block_of_its_own_is_refused_where_two_blocks_disagree() -> None:
    """A thread started without a copy of any context cannot tell which of two queries'
    blocks is its own: refused, never a guess. One started in a copy of its caller's
    context sees its caller's."""
    opened, done = threading.Event(), threading.Event()
    seen: list[object] = []

    def other_query() -> None:
        with settings.using({"fs.s3a.endpoint": "http://other:9000"}):
            opened.set()
            done.wait()

    def lookup() -> None:
        try:
            seen.append(settings.hadoop_setting("fs.s3a.endpoint"))
        except ConfigurationError as exc:
            seen.append(exc)

    other = threading.Thread(target=other_query)
    other.start()
    try:
        opened.wait()
        with settings.using({"fs.s3a.endpoint": "http://mine:9000"}):
            _run_threads(lookup)
            _run_threads(contextvars.copy_context().run, args=(lookup,))
    finally:
        done.set()
        other.join()
    assert isinstance(seen[0], ConfigurationError)
    assert "http://mine:9000, http://other:9000" in str(seen[0])
    assert seen[1:] == ["http://mine:9000"]


def test_phase_2_commit_threads_see_the_settings_of_the_committing_call() -> None:
    """``Recovery.commit_on_driver`` commits on a pool of threads: each runs in a copy of
    the caller's context, so it finds the caller's endpoint even while another query's
    block with another endpoint is open in the process."""
    opened, done = threading.Event(), threading.Event()

    def other_query() -> None:
        with settings.using({"fs.s3a.endpoint": "http://other:9000"}):
            opened.set()
            done.wait()

    seen: list[str | None] = []
    scope = SimpleNamespace(faults=FaultPlan(), config=SimpleNamespace(commit_parallelism=4))
    other = threading.Thread(target=other_query)
    other.start()
    try:
        opened.wait()
        with settings.using({"fs.s3a.endpoint": "http://mine:9000"}):
            Recovery(scope).commit_on_driver(  # type: ignore[arg-type]
                lambda item: seen.append(settings.hadoop_setting("fs.s3a.endpoint")),
                [object()] * 6, 0, True)
    finally:
        done.set()
        other.join()
    assert seen == ["http://mine:9000"] * 6


# -- a store that cannot be reached names the setting and the fixes -------------------------
@pytest.fixture
def closed_port() -> Iterator[int]:
    """A local port nothing listens on (bound by the test, so nobody takes it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_an_unreachable_s3_endpoint_names_its_setting_and_both_fixes(
        monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    _no_endpoint_env(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "sparkeos")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sparkeos")
    monkeypatch.setattr(s3_store, "BOTO_ATTEMPTS", 1)
    endpoint = f"http://127.0.0.1:{closed_port}"
    with settings.using({"fs.s3a.bucket.my.lake.endpoint": endpoint}):
        files = S3Files.from_environment("s3a", "my.lake")
    with pytest.raises(RetriableError) as info:
        files.exists("/x")
    text = str(info.value)
    assert f"s3a://my.lake at {endpoint} cannot be reached" in text
    assert (f"the endpoint {endpoint} came from spark.hadoop.fs.s3a.bucket.my.lake.endpoint"
            f" (from {settings.CARRIED})") in text
    _names_both_fixes(info.value, '.option("spark.hadoop.fs.s3a.endpoint", ...)',
                      '.option("spark.hadoop.fs.s3a.bucket.my.lake.endpoint", ...)')
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    with pytest.raises(RetriableError, match="came from AWS_ENDPOINT_URL_S3"):
        S3Files.from_environment("s3a", "lake").exists("/x")


def test_no_s3_endpoint_at_all_says_it_fell_back_to_amazon_s3(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """No network needed: without credentials botocore refuses before it connects."""
    _no_endpoint_env(monkeypatch)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    files = S3Files.from_environment("s3a", "lake")
    assert files.endpoint is None and files.endpoint_from == ""
    with pytest.raises(ConfigurationError) as info:
        files.exists("/x")
    assert ("no endpoint setting reached this process (AWS_ENDPOINT_URL_S3, "
            "AWS_ENDPOINT_URL, spark.hadoop.fs.s3a.endpoint, "
            "spark.hadoop.fs.s3a.bucket.lake.endpoint), so it used Amazon S3's own"
            ) in str(info.value)
    _names_both_fixes(info.value, '.option("spark.hadoop.fs.s3a.endpoint", ...)')


def test_an_unreachable_gcs_endpoint_names_its_setting_and_both_fixes(
        monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    endpoint = f"http://127.0.0.1:{closed_port}"
    with settings.using({"fs.gs.storage.root.url": endpoint}):
        files = dataclasses.replace(GcsFiles.from_environment("gs", "lake"), retry_s=0.2)
    with pytest.raises(RetriableError) as info:
        files.exists("/x")
    assert f"gs://lake at {endpoint} cannot be reached" in str(info.value)
    assert (f"the endpoint {endpoint} came from spark.hadoop.fs.gs.storage.root.url (from "
            f"{settings.CARRIED})") in str(info.value)
    _names_both_fixes(info.value, '.option("spark.hadoop.fs.gs.storage.root.url", ...)')


def test_an_unreachable_azure_endpoint_names_where_it_came_from(
        monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    """Azure's endpoint is the connection string's (or the URI's host): no Spark setting,
    so the fix is the environment, and the message says a format option would not do."""
    endpoint = f"http://127.0.0.1:{closed_port}/acct"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       f"AccountName=acct;AccountKey=a2V5;BlobEndpoint={endpoint}")
    files, _path = split_uri("abfs://box@acct.dfs.core.windows.net/x")
    assert isinstance(files, AzureBlobFiles)
    with pytest.raises(RetriableError) as info:
        dataclasses.replace(files, retries=0).exists("/x")
    text = str(info.value)
    assert f"at {endpoint} cannot be reached" in text
    assert "came from AZURE_STORAGE_CONNECTION_STRING (account acct)" in text
    assert info.value.fix is not None and "BlobEndpoint" in info.value.fix
    assert "sparkeos.register(spark) do not change it" in info.value.fix


def _names_both_fixes(error: SparkEOSError, *options: str) -> None:
    assert error.fix is not None
    for option in options:
        assert option in error.fix, error.fix
    assert "sparkeos.register(spark)" in error.fix, error.fix


def _no_endpoint_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION",
                 "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)


def _run_threads(*targets: Callable[..., object], args: tuple[Any, ...] = ()) -> None:
    threads = [threading.Thread(target=t, args=args) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_a_block_without_the_setting_disagrees_with_one_that_has_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Query A carries an endpoint, query B none (Amazon S3): a thread of B's started
    without a copy of B's context must not take A's endpoint; it is refused."""
    import threading

    from sparkeos.core.errors import ConfigurationError
    from sparkeos.core.storage.stores import settings

    monkeypatch.setattr(settings, "_session_setting", lambda key: None)
    monkeypatch.setattr(settings, "_task_property", lambda key: None)
    seen: dict[str, Any] = {}
    a_open, b_done = threading.Event(), threading.Event()

    def query_a() -> None:
        with settings.using({"fs.s3a.endpoint": "http://store-a:9000"}):
            a_open.set()
            b_done.wait()

    def query_b() -> None:
        a_open.wait()
        with settings.using({}):
            def work() -> None:
                try:
                    seen["endpoint"] = settings.hadoop_setting("fs.s3a.endpoint")
                except ConfigurationError as exc:
                    seen["refused"] = str(exc)
            worker = threading.Thread(target=work)
            worker.start()
            worker.join()
        b_done.set()

    threads = [threading.Thread(target=query_a), threading.Thread(target=query_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert "endpoint" not in seen and "(none)" in seen["refused"]
