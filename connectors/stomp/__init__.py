"""JMS-style messaging over STOMP (stomp.py): an exactly-once sink and an
acknowledging source with deduplication.

    from sparkeos import exactly_once
    from sparkeos.connectors.stomp import StompSink, stomp_source

    orders = stomp_source(spark, "stomp://app:secret@broker:61613", "orders")
    sink = StompSink("stomp://app:secret@broker:61613", destination="orders.out")
    orders.writeStream.foreachBatch(exactly_once(sink, name="to-broker")).start()

stomp.py is imported only when a connection is opened. See ``sink`` and ``source`` for
how each commits, and docs/connectors/stomp.md for the guarantees per broker.
"""

from typing import TYPE_CHECKING

from sparkeos.core.lazy import lazy_exports

if TYPE_CHECKING:
    from .client import Endpoint, StompClient, broker_kind, redact_url
    from .sink import StompSink, default_staging_dir
    from .source import stomp_source
    from .sourceconfig import StompSourceConfig

# Imported on first use (sparkeos.core.lazy): Spark imports the format of this
# connector in processes that need its class only.
__getattr__ = lazy_exports(__name__, {
    "Endpoint": ".client",
    "StompClient": ".client",
    "StompSink": ".sink",
    "StompSourceConfig": ".sourceconfig",
    "broker_kind": ".client",
    "default_staging_dir": ".sink",
    "redact_url": ".client",
    "stomp_source": ".source",
})

__all__ = [
    "Endpoint",
    "StompClient",
    "StompSink",
    "StompSourceConfig",
    "broker_kind",
    "default_staging_dir",
    "redact_url",
    "stomp_source",
]
