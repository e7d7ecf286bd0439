"""Exactly-once into any SQL database through a staging table (SQLAlchemy).

    from sparkeos import exactly_once
    from sparkeos.connectors.sql import SqlTableSink

    sink = SqlTableSink(url="sqlite:////data/shop.db", table="orders", create_table=True)
    df.writeStream.foreachBatch(exactly_once(sink, name="orders-to-sqlite"))

SQLAlchemy is imported only when the sink talks to the database (extra ``sparkeos[sql]``).
"""

from typing import TYPE_CHECKING

from sparkeos.core.lazy import lazy_exports

if TYPE_CHECKING:
    from .sink import SqlTableSink

# Imported on first use (sparkeos.core.lazy): Spark imports the format of this
# connector in processes that need its class only.
__getattr__ = lazy_exports(__name__, {
    "SqlTableSink": ".sink",
})

__all__ = ["SqlTableSink"]
