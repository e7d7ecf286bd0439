"""The file sink as Spark formats: ``writeStream.format("sparkeos-parquet")`` and
``format("sparkeos-json")`` take what Spark's ``parquet`` and ``json`` sinks take where
the file sink can honour it (``path``, Parquet's ``compression``), the layout of
``partitionBy`` as ``sparkeos.partitionBy`` (Spark never passes ``.partitionBy(...)`` to
a Python sink), and the ``sparkeos.*`` options every format shares
(``core.streaming.streamformat``).

Spark's Parquet writer follows session settings (``spark.sql.parquet.*``) that Spark
does not give a Python data source: ``sparkeos-parquet`` has them from
``sparkeos.register(spark)``, which captures them, and from options of the same names,
which win; Spark's defaults otherwise (``connectors/file/parquet.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.streaming.streamformat import Options, SinkFormat

from .parquet_settings import SETTINGS as PARQUET_SETTINGS

if TYPE_CHECKING:  # the sink is imported where made: Spark imports a format where it
    # needs only the class (sparkeos.core.lazy)
    import pyarrow as pa

    from .sink import FileSink


PARTITION_BY = "sparkeos.partitionBy"
"""The partition columns, comma-separated: ``.option("sparkeos.partitionBy", "day")``."""


class ParquetFormat(SinkFormat):
    """``format("sparkeos-parquet")``: Parquet part files under ``path``."""

    format_name = "sparkeos-parquet"
    session_settings = PARQUET_SETTINGS

    def make_sink(self, options: Options, schema: pa.Schema) -> FileSink:
        from .sink import FileSink

        given = {name: value for name in PARQUET_SETTINGS
                 if (value := options.get(name)) is not None}
        return FileSink(path=options.require("path", '"/data/out"'), format="parquet",
                        compression=(options.get("compression")
                                     or options.get("parquet.compression")),
                        spark_settings={**self.captured_settings, **given},
                        fsync=options.flag("sparkeos.fsync", True),
                        partition_by=options.names(PARTITION_BY) or ())


class JsonFormat(SinkFormat):
    """``format("sparkeos-json")``: JSON Lines part files under ``path`` (one JSON
    object per row, as Spark's ``json`` sink writes them)."""

    format_name = "sparkeos-json"

    def make_sink(self, options: Options, schema: pa.Schema) -> FileSink:
        from .sink import FileSink

        compression = (options.get("compression") or "none").lower()
        if compression not in ("none", "uncompressed"):
            raise ConfigurationError(
                f"the sparkeos-json format writes uncompressed files (compression="
                f"{compression!r} was asked)",
                fix='drop the compression option, or use format("sparkeos-parquet")')
        return FileSink(path=options.require("path", '"/data/out"'), format="jsonl",
                        fsync=options.flag("sparkeos.fsync", True),
                        partition_by=options.names(PARTITION_BY) or ())


FORMATS = (ParquetFormat, JsonFormat)
