"""The PostgreSQL sink as a Spark format: ``writeStream.format("sparkeos-postgres")``
takes the options Spark's JDBC data source takes for PostgreSQL: ``url``
(``jdbc:postgresql://host:port/database``, or a ``postgresql://`` URI), ``dbtable``,
``user``, ``password``. sparkeos' own: ``sparkeos.mode`` (``transactional`` or
``upsert``), ``sparkeos.key`` (comma-separated key columns, for upserts),
``sparkeos.createTable`` (default ``true``: a missing table is created from the
stream's schema, as Spark's JDBC writer does in append mode),
``sparkeos.markerTable``, ``sparkeos.lockTimeoutSeconds``, and the options every format
shares (``core.streaming.streamformat``).

Upserts through the format: rows of one key must reach one task (two prepared
transactions holding one row would wait for each other), so repartition the stream by
the key first, e.g. ``df.repartition(8, "id")``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import quote

from sparkeos.core.errors import ConfigurationError
from sparkeos.core.streaming.streamformat import Options, SinkFormat

if TYPE_CHECKING:  # the sink is imported where made: Spark imports a format where it
    # needs only the class (sparkeos.core.lazy)
    import pyarrow as pa

    from .sink import PostgresSink


_JDBC = "jdbc:"


class PostgresFormat(SinkFormat):
    """``format("sparkeos-postgres")``: a PostgreSQL table, exactly once."""

    format_name = "sparkeos-postgres"

    def make_sink(self, options: Options, schema: pa.Schema) -> PostgresSink:
        from .sink import PostgresSink

        return PostgresSink(
            dsn=postgres_uri(options.require("url", '"jdbc:postgresql://db:5432/shop"'),
                             options.get("user"), options.get("password")),
            table=options.require("dbtable", '"orders"'),
            mode=options.get("sparkeos.mode") or "transactional",
            key=options.names("sparkeos.key"),
            create_table=options.flag("sparkeos.createTable", True),
            marker_table=options.get("sparkeos.markerTable") or "sparkeos_markers",
            lock_timeout_s=options.number("sparkeos.lockTimeoutSeconds", 30.0))


def postgres_uri(url: str, user: str | None, password: str | None) -> str:
    """A libpq URI from Spark's JDBC ``url`` and its ``user`` / ``password`` options."""
    if url.lower().startswith(_JDBC):
        url = url[len(_JDBC):]
    if not url.lower().startswith(("postgresql://", "postgres://")):
        raise ConfigurationError(
            f"sparkeos-postgres writes to PostgreSQL; the url {url.split('?')[0]!r} is not "
            "a PostgreSQL URL",
            fix='.option("url", "jdbc:postgresql://host:5432/database")')
    params = [f"{name}={quote(value, safe='')}" for name, value in
              (("user", user), ("password", password)) if value]
    if params:
        url += ("&" if "?" in url else "?") + "&".join(params)
    return url


FORMATS = (PostgresFormat,)
