"""The STOMP sink as a Spark format: ``writeStream.format("sparkeos-stomp")``.

Spark has no STOMP sink to copy, so the options follow its Kafka sink's shape:

* ``url`` (required), e.g. ``stomp://login@host:61613``, and ``passcode``;
* ``destination``: every message's destination (it overrides a ``destination``
  column);
* columns ``body`` (bytes or text; without it, the whole row as a JSON object),
  ``destination``, ``headers`` (``map<string,string>`` or ``array<struct<key,value>>``).

sparkeos' own: ``sparkeos.destinationType`` (``ANYCAST``, ``MULTICAST`` or ``none``),
``sparkeos.duplicateDetection``, ``sparkeos.idCacheSize``, ``sparkeos.fsync`` and
``sparkeos.stagingDir``. The staging directory defaults to
``<checkpoint>/sparkeos-staging/<name>``, shared by every restart (and, on a cluster,
by every executor). Complete mode publishes every batch's whole result table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkeos.core.streaming.streamformat import Options, SinkFormat

if TYPE_CHECKING:  # the sink is imported where made: Spark imports a format where it
    # needs only the class (sparkeos.core.lazy)
    import pyarrow as pa

    from .sink import StompSink


class StompFormat(SinkFormat):
    """``format("sparkeos-stomp")``: messages to a STOMP broker, exactly once on
    ActiveMQ Artemis."""

    format_name = "sparkeos-stomp"
    complete_mode_appends = True

    def make_sink(self, options: Options, schema: pa.Schema) -> StompSink:
        from sparkeos.core.storage.staging import checkpoint_staging_dir

        from .sink import StompSink

        columns = set(schema.names)
        destination = options.get("destination")
        routing = options.get("sparkeos.destinationType") or "ANYCAST"
        staging = options.get("sparkeos.stagingDir")
        checkpoint = options.get("checkpointLocation")
        if staging is None and checkpoint:
            staging = checkpoint_staging_dir(checkpoint, options.sink_name())
        return StompSink(
            url=options.require("url", '"stomp://app@broker:61613"'),
            passcode=options.get("passcode"),
            destination=destination,
            destination_column="destination" if destination is None else None,
            body_column="body" if "body" in columns else None,
            headers_column="headers" if "headers" in columns else None,
            destination_type=None if routing.lower() == "none" else routing.upper(),
            duplicate_detection=options.get("sparkeos.duplicateDetection") or "broker",
            id_cache_size=options.integer("sparkeos.idCacheSize", 20_000),
            staging_dir=staging,
            fsync=options.flag("sparkeos.fsync", True))


FORMATS = (StompFormat,)
