"""Where the object stores are, for processes without a Spark session: the settings a
format carries (issue 37, item 3). The format route end to end on S3 with the endpoint
only in Spark's own setting: integration/connectors/file/test_file_conformance.py."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from pyspark import cloudpickle

from sparkeos.core.stores import settings
from sparkeos.core.stores.s3 import S3Files
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
