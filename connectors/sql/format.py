"""The SQL sink as a Spark format: ``writeStream.format("sparkeos-sql")`` writes to any
database SQLAlchemy reaches, through a staging table moved into the target in one
local transaction.

* ``url`` (required): an SQLAlchemy URL (``sqlite:///shop.db``,
  ``mysql+pymysql://user:pass@host/shop``...); a secret, never written to the commit log;
* ``dbtable`` (required), as Spark's JDBC option;
* ``sparkeos.key``: comma-separated columns to replace rows by (an upsert) instead of
  appending; ``sparkeos.createTable``: create a missing table from the stream's schema
  (default ``true``, as Spark's JDBC writer does in append mode; ``false`` refuses it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkeos.core.streaming.streamformat import Options, SinkFormat

if TYPE_CHECKING:  # the sink is imported where made: Spark imports a format where it
    # needs only the class (sparkeos.core.lazy)
    import pyarrow as pa

    from .sink import SqlTableSink


class SqlFormat(SinkFormat):
    """``format("sparkeos-sql")``: a table of any SQLAlchemy database, exactly once."""

    format_name = "sparkeos-sql"

    def make_sink(self, options: Options, schema: pa.Schema) -> SqlTableSink:
        from .sink import SqlTableSink

        return SqlTableSink(
            url=options.require("url", '"sqlite:////data/shop.db"'),
            table=options.require("dbtable", '"orders"'),
            create_table=options.flag("sparkeos.createTable", True),
            key=options.names("sparkeos.key"))


FORMATS = (SqlFormat,)
