"""Locations split as Hadoop splits them, checked against Hadoop's own ``Path`` in the
session's JVM; and a running query's checkpoint with ``#``, ``?``, a space and ``%`` in
its name found where Spark keeps it."""

from __future__ import annotations

from typing import Any

from sparkeos.core.storage.locations import parse
from sparkeos.core.streaming.spark import query_checkpoint_in
from tests.core.storage.test_locations import HADOOP_CASES


def test_every_location_splits_as_hadoops_path(spark: Any) -> None:
    jvm = spark.sparkContext._jvm
    for location, _parts in HADOOP_CASES:
        uri = jvm.org.apache.hadoop.fs.Path(location).toUri()
        ours = parse(location)
        theirs = (str(uri.getScheme() or "").lower(), str(uri.getAuthority() or ""),
                  str(uri.getPath() or ""))
        assert (ours.scheme, ours.authority, ours.path) == theirs, location


def test_a_running_querys_checkpoint_is_its_path_not_its_uri(spark: Any, tmp_path: Any
                                                             ) -> None:
    """The checkpoint Spark reports for a running query is the directory it writes
    (``ckpt#1 a%b?c``, not ``ckpt``): the commit log goes there, where ``sparkeos
    recover`` looks."""
    checkpoint = tmp_path / "ckpt#1 a%b?c"
    query = (spark.readStream.format("rate").option("rowsPerSecond", 1).load()
             .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .start())
    try:
        found = query_checkpoint_in(spark, str(query.id))
    finally:
        query.stop()
    assert found is not None and parse(found).path == str(checkpoint), found
    assert (checkpoint / "metadata").exists()
