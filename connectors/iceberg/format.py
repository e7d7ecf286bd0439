"""The Iceberg sink as a Spark format: ``writeStream.format("sparkeos-iceberg")``
appends each batch once to an Iceberg table (``sink.py``), with options in the shape of
Spark's own Iceberg sink where they apply:

* ``path`` (required; or ``.start(identifier)``): the table's identifier,
  ``namespace.name`` (Spark's Iceberg sink takes the table's name there too);
* ``sparkeos.catalog.<property>``: the pyiceberg catalog's properties (``type``, ``uri``,
  ``warehouse``...); Spark hands a Python format its option keys lower-cased, so a
  property with capitals goes in through the environment
  (``PYICEBERG_CATALOG__<NAME>__<PROPERTY>``), as pyiceberg reads it;
* ``sparkeos.catalogName``: the catalog's name (default ``default``);
* ``sparkeos.partitionBy``: the partition spec of a table the sink makes, in Spark
  SQL's spellings, separated by commas (``"region, days(at), bucket(16, id)"``): Spark
  gives a Python format no ``partitionBy(...)``. Left out: the table's own spec;
* ``mergeSchema`` (``true``/``false``, default false): add the batch's new columns to the
  table, as Spark's Iceberg and Delta writers take it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkeos.core.streaming.streamformat import Options, SinkFormat

if TYPE_CHECKING:  # the sink is imported where made (sparkeos.core.lazy)
    import pyarrow as pa

    from .sink import IcebergSink


class IcebergFormat(SinkFormat):
    """``format("sparkeos-iceberg")``: an Apache Iceberg table, exactly once."""

    format_name = "sparkeos-iceberg"

    def make_sink(self, options: Options, schema: pa.Schema) -> IcebergSink:
        from .partitioning import split_option
        from .sink import IcebergSink

        return IcebergSink(table=options.require("path", '"db.orders"'),
                           catalog=options.with_prefix("sparkeos.catalog."),
                           catalog_name=options.get("sparkeos.catalogName") or "default",
                           partition_by=split_option(options.get("sparkeos.partitionBy")),
                           merge_schema=options.flag("mergeSchema", False))


FORMATS = (IcebergFormat,)
