"""Exactly-once into any SQL database through a staging table (SQLAlchemy).

    from sparkeos import exactly_once
    from sparkeos.connectors.sql import SqlTableSink

    sink = SqlTableSink(url="sqlite:////data/shop.db", table="orders", create_table=True)
    df.writeStream.foreachBatch(exactly_once(sink, name="orders-to-sqlite"))

SQLAlchemy is imported only when the sink talks to the database (extra ``sparkeos[sql]``).
"""

from .sink import SqlTableSink

__all__ = ["SqlTableSink"]
