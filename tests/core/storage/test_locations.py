"""Locations read as Hadoop's ``new Path(String)`` reads them (``core/storage/locations.py``); the
same table is checked against Hadoop's own Path through Spark in
integration/core/test_locations.py."""

from __future__ import annotations

import pytest

from sparkeos.core.snapshot.commitlog import sink_log_location
from sparkeos.core.storage.locations import Location, parse
from sparkeos.core.storage.registry import split_uri
from sparkeos.core.storage.stores.local import LocalFiles

HADOOP_CASES = [
    ("/tmp/ckpt", ("", "", "/tmp/ckpt")),
    ("relative/dir", ("", "", "relative/dir")),
    ("file:/tmp/ckpt#1", ("file", "", "/tmp/ckpt#1")),
    ("file:///tmp/a b/c%41", ("file", "", "/tmp/a b/c%41")),
    ("s3a://bucket/ckpt#1", ("s3a", "bucket", "/ckpt#1")),
    ("s3a://bucket/out?v=2", ("s3a", "bucket", "/out?v=2")),
    ("S3A://Bucket/dir/with space/100%", ("s3a", "Bucket", "/dir/with space/100%")),
    ("hdfs://nn:8020/user/x#y?z", ("hdfs", "nn:8020", "/user/x#y?z")),
    ("webhdfs://nn:9870/a", ("webhdfs", "nn:9870", "/a")),
    ("s3a://bucket", ("s3a", "bucket", "")),
    ("/tmp/a:b", ("", "", "/tmp/a:b")),
]
"""(location, (scheme, authority, path)) as Hadoop's Path splits it."""


@pytest.mark.parametrize(("location", "parts"), HADOOP_CASES)
def test_a_location_splits_as_hadoops_path_splits_it(location, parts):
    assert parse(location) == Location(parts[0].lower(), parts[1], parts[2])


def test_hash_and_question_mark_stay_in_the_key_and_two_checkpoints_stay_apart():
    """Issue 37, 4: ``ckpt#1`` and ``ckpt#2`` were one commit log; ``out?v=2`` was
    written under ``out``."""
    first = split_uri(sink_log_location("s3a://bucket/ckpt#1", "sink"))
    second = split_uri(sink_log_location("s3a://bucket/ckpt#2", "sink"))
    assert first[1] == "/ckpt#1/sparkeos/sink" and second[1] == "/ckpt#2/sparkeos/sink"
    assert split_uri("s3a://bucket/out?v=2")[1] == "/out?v=2"
    files, path = split_uri("file:/tmp/ckpt#1")
    assert isinstance(files, LocalFiles) and path == "/tmp/ckpt#1"
    hdfs, path = split_uri("webhdfs://nn:9871/a#b")
    assert path == "/a#b" and hdfs.uri(path) == "webhdfs://nn:9871/a#b"
