"""``sparkeos.register(spark)``: every sparkeos sink as a ``writeStream.format(...)``.

A format's sink is built in Spark's Python workers from its options; the connector's
own extra (``sparkeos[kafka]``...) must be installed where those workers run."""

from __future__ import annotations

from typing import Any


def format_classes() -> list[type[Any]]:
    """The format classes of every connector, in registration order."""
    from sparkeos.connectors.delta.format import FORMATS as DELTA
    from sparkeos.connectors.file.format import FORMATS as FILES
    from sparkeos.connectors.iceberg.format import FORMATS as ICEBERG
    from sparkeos.connectors.jdbc.format import FORMATS as POSTGRES
    from sparkeos.connectors.kafka.format import FORMATS as KAFKA
    from sparkeos.connectors.sql.format import FORMATS as SQL
    from sparkeos.connectors.stomp.format import FORMATS as STOMP

    return [*FILES, *KAFKA, *POSTGRES, *STOMP, *SQL, *DELTA, *ICEBERG]


def register(spark: Any) -> list[str]:
    """Register every sparkeos format with ``spark`` (a classic or a Spark Connect
    session); returns their names, e.g. ``sparkeos-parquet``.

    The session's object-store locations (``spark.hadoop.fs.s3a.endpoint``...; never
    credentials) go with the registered formats: Spark gives a format's planner and
    committer no session, so without them an ``s3a://`` checkpoint there would be looked
    for on Amazon S3 (``core.storage.stores.settings``). So do the settings a format's sink
    follows as Spark's own sink does (``spark.sql.parquet.outputTimestampType``...:
    ``SinkFormat.session_settings``). Register after setting them."""
    from sparkeos.core.storage.stores.settings import captured_from
    from sparkeos.core.streaming.spark import session_settings

    locations = captured_from(spark)
    names = []
    for cls in format_classes():
        settings = session_settings(spark, cls.session_settings)
        spark.dataSource.register(_carrying(cls, locations, settings)
                                  if locations or settings else cls)
        names.append(cls.name())
    return names


def _carrying(cls: type[Any], locations: dict[str, str],
              settings: dict[str, str] | None = None) -> type[Any]:
    """``cls`` with ``locations`` as its ``store_locations`` and ``settings`` as its
    ``captured_settings``: a class made here, which Spark's cloudpickle sends by value
    (with the settings) to every Python worker."""
    return type(cls.__name__, (cls,), {"store_locations": dict(locations),
                                       "captured_settings": dict(settings or {}),
                                       "__module__": cls.__module__,
                                       "__qualname__": f"{cls.__qualname__}.registered"})


__all__ = ["format_classes", "register"]
