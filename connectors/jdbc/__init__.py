"""Exactly-once PostgreSQL sink: appends by two-phase commit, upserts by key.

    from sparkeos import exactly_once
    from sparkeos.connectors.jdbc import PostgresSink

    sink = PostgresSink(dsn="postgresql://app@db:5432/shop", table="orders", key=["order_id"])
    df.writeStream.foreachBatch(exactly_once(sink, name="orders-to-pg"))

psycopg2 is imported only when the sink talks to the database (extra ``sparkeos[jdbc]``).
"""

from typing import TYPE_CHECKING

from sparkeos.core.lazy import lazy_exports

if TYPE_CHECKING:
    from sparkeos.core.errors import DataRejectedError

    from .errors import translate_error
    from .sink import PgTransaction, PostgresSink

# Imported on first use (sparkeos.core.lazy): Spark imports the format of this
# connector in processes that need its class only.
__getattr__ = lazy_exports(__name__, {
    "DataRejectedError": "sparkeos.core.errors",
    "PgTransaction": ".sink",
    "PostgresSink": ".sink",
    "translate_error": ".errors",
})

__all__ = ["DataRejectedError", "PgTransaction", "PostgresSink", "translate_error"]
