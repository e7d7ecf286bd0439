"""The Delta sink as a Spark format: ``writeStream.format("sparkeos-delta")`` appends
each batch once to a Delta table (``sink.py``), with the options Spark's own Delta sink
takes where they apply:

* ``path`` (required; or ``.start(path)``): the table's location;
* ``sparkeos.partitionBy``: comma-separated partition columns (Spark gives a Python
  format no ``partitionBy(...)``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkeos.core.streaming.streamformat import Options, SinkFormat

if TYPE_CHECKING:  # the sink is imported where made (sparkeos.core.lazy)
    import pyarrow as pa

    from .sink import DeltaSink


class DeltaFormat(SinkFormat):
    """``format("sparkeos-delta")``: a Delta Lake table, exactly once."""

    format_name = "sparkeos-delta"

    def make_sink(self, options: Options, schema: pa.Schema) -> DeltaSink:
        from .sink import DeltaSink

        return DeltaSink(path=options.require("path", '"/data/tables/orders"'),
                         partition_by=tuple(options.names("sparkeos.partitionBy") or ()))


FORMATS = (DeltaFormat,)
