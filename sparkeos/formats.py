"""``sparkeos.register(spark)``: every sparkeos sink as a ``writeStream.format(...)``.

A format's sink is built in Spark's Python workers from its options; the connector's
own extra (``sparkeos[kafka]``...) must be installed where those workers run."""

from __future__ import annotations

from typing import Any


def format_classes() -> list[type[Any]]:
    """The format classes of every connector, in registration order."""
    from sparkeos.connectors.file.format import FORMATS as FILES
    from sparkeos.connectors.jdbc.format import FORMATS as POSTGRES
    from sparkeos.connectors.kafka.format import FORMATS as KAFKA
    from sparkeos.connectors.sql.format import FORMATS as SQL
    from sparkeos.connectors.stomp.format import FORMATS as STOMP

    return [*FILES, *KAFKA, *POSTGRES, *STOMP, *SQL]


def register(spark: Any) -> list[str]:
    """Register every sparkeos format with ``spark`` (a classic or a Spark Connect
    session); returns their names, e.g. ``sparkeos-parquet``."""
    names = []
    for cls in format_classes():
        spark.dataSource.register(cls)
        names.append(cls.name())
    return names


__all__ = ["format_classes", "register"]
