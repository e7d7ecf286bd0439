"""The Iceberg catalog the sink reaches its table through (pyiceberg's SQL catalog so
far), its settings checked when the sink is made, and the table's own checks: where it
lives, its partitioning and its columns.

Catalogs are opened once per process and thread (pyiceberg builds a SQLAlchemy engine
for each, and imports a good deal the first time); tables are loaded afresh for every
use, so each sees the catalog's current metadata.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from sparkeos.core.errors import ConfigurationError, RetriableError
from sparkeos.core.storage.logstores import is_local_uri

from .evolution import check_columns
from .files import normalised_schema, table_location
from .partitioning import PartitionColumn, check_spec, create_spec
from .stores import check_location

CATALOG_EXAMPLE = ('catalog={"type": "sql", "uri": "sqlite:////data/iceberg/catalog.db", '
                   '"warehouse": "file:///data/iceberg/warehouse"}')

_OPEN = threading.local()


def checked_catalog(catalog: Mapping[str, Any]) -> dict[str, str]:
    """The catalog's properties as pyiceberg takes them, refused with the fix when the
    sink cannot use them yet."""
    if not isinstance(catalog, Mapping) or not catalog:
        raise ConfigurationError("IcebergSink needs the catalog's properties",
                                 fix=f"IcebergSink('db.orders', {CATALOG_EXAMPLE})")
    properties = {str(k): str(v) for k, v in catalog.items()}
    kind = properties.get("type", "")
    if kind != "sql":
        raise ConfigurationError(
            f"IcebergSink works with pyiceberg's SQL catalog so far, not type={kind!r}",
            fix=f'give "type": "sql" and the catalog database\'s "uri": {CATALOG_EXAMPLE}; '
            "REST, Hive and Glue catalogs come next (issue 51)")
    if not properties.get("uri"):
        raise ConfigurationError("the SQL catalog needs its database's \"uri\"",
                                 fix=CATALOG_EXAMPLE)
    warehouse = properties.get("warehouse")
    if not warehouse:
        raise ConfigurationError("the SQL catalog needs a \"warehouse\": where its tables go",
                                 fix=CATALOG_EXAMPLE)
    database = sqlite_path(properties["uri"])
    for what, path in (("warehouse", warehouse.removeprefix("file://")),
                       ("SQLite catalog", database)):
        if path and path != ":memory:" and "://" not in path and not os.path.isabs(path):
            raise ConfigurationError(
                f"the {what} path {path!r} is relative: the driver and every executor "
                "would each resolve it in their own working directory",
                fix=f"an absolute path on a mount every process sees: {CATALOG_EXAMPLE}")
    check_location(warehouse, "warehouse")
    return properties


SECRET_MARKERS = ("secret", "password", "token", "access-key", "account-key", "credential",
                  "connection-string")
"""Catalog properties whose values are masked wherever they are recorded or shown."""


def shown_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """The catalog's properties as recorded and printed: secrets masked."""
    return {k: (shown_uri(v) if k == "uri"
                else "***" if any(m in k.lower() for m in SECRET_MARKERS) else v)
            for k, v in properties.items()}


def sqlite_path(uri: str) -> str:
    """The database file of a ``sqlite:///<path>`` catalog URI; empty for any other."""
    return uri[len("sqlite:///"):] if uri.startswith("sqlite:///") else ""


def local_directories(properties: Mapping[str, str]) -> tuple[str, ...]:
    """The warehouse and the SQLite catalog's directory, where they are local paths."""
    found = []
    warehouse = properties.get("warehouse", "")
    if is_local_uri(warehouse):
        found.append(warehouse.removeprefix("file://"))
    database = sqlite_path(properties.get("uri", ""))
    if database and database != ":memory:":
        found.append(os.path.dirname(database))
    return tuple(found)


def checked_identifier(table: str) -> str:
    if not isinstance(table, str) or len([p for p in table.split(".") if p]) < 2 \
            or "" in table.split("."):
        raise ConfigurationError(f"IcebergSink needs a table identifier with its "
                                 f"namespace, not {table!r}",
                                 fix='IcebergSink("db.orders", catalog=...)')
    return table


def shown_uri(uri: str) -> str:
    """The catalog database's URI without a password (it is recorded and printed)."""
    parsed = urllib.parse.urlsplit(uri)
    if parsed.password is None:
        return uri
    netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@")
    return urllib.parse.urlunsplit(parsed._replace(netloc=netloc))


def open_catalog(name: str, properties: Mapping[str, str]) -> Any:
    from pyiceberg.catalog import load_catalog

    catalogs: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = (
        getattr(_OPEN, "catalogs", None) or {})
    _OPEN.catalogs = catalogs
    key = (name, tuple(sorted(properties.items())))
    if key not in catalogs:
        _make_sqlite_directory(properties.get("uri", ""))
        catalogs[key] = load_catalog(name, **properties)
    return catalogs[key]


def _make_sqlite_directory(uri: str) -> None:
    """A SQLite catalog's directory, made if missing (SQLite makes the file, not its
    directory; pyiceberg makes the warehouse's)."""
    database = sqlite_path(uri)
    if database and database != ":memory:" and os.path.dirname(database):
        os.makedirs(os.path.dirname(database), exist_ok=True)


def load_table(catalog: Any, identifier: str) -> Any | None:
    """The table as the catalog holds it now; None if there is none."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except NoSuchTableError:
        return None


def create_table(catalog: Any, identifier: str, schema: pa.Schema,
                 partition: Sequence[PartitionColumn] = ()) -> Any:
    """The table, made from the batch's schema and partitioned by ``partition`` if it
    does not exist (another process making it at the same moment is fine)."""
    from pyiceberg.exceptions import TableAlreadyExistsError

    namespace = identifier.rsplit(".", 1)[0]
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except Exception:  # the SQL catalog's race: another process made it meanwhile
        if not catalog.namespace_exists(namespace):
            raise
    try:
        if not partition:
            return catalog.create_table(identifier, schema=normalised_schema(schema))
        # One metadata commit makes the table with its spec: no reader sees it without.
        creating = catalog.create_table_transaction(identifier,
                                                    schema=normalised_schema(schema))
        create_spec(creating, partition)
        return creating.commit_transaction()
    except TableAlreadyExistsError:
        return catalog.load_table(identifier)
    except OSError as exc:  # the warehouse's store, unreachable or refusing
        raise RetriableError(
            f"cannot create the Iceberg table {identifier}: writing its metadata failed: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            fix="check the warehouse's store: its endpoint (S3: the catalog's "
            "s3.endpoint, AWS_ENDPOINT_URL_S3 or spark.hadoop.fs.s3a.endpoint; GCS: "
            "gcs.service.host or STORAGE_EMULATOR_HOST; Azure: the connection string's "
            "BlobEndpoint), region and credentials; retried with the batch") from None
    except Exception as exc:
        unsupported = type(exc).__name__ == "UnsupportedPyArrowTypeException"
        raise ConfigurationError(
            f"cannot create the Iceberg table {identifier}: {exc}",
            fix="cast the column to a type Iceberg has, or create the table first"
            if unsupported else "check the catalog's properties and the warehouse's "
            "location, or create the table first") from None


def check_table(table: Any, identifier: str, schema: pa.Schema,
                partition: Sequence[PartitionColumn] = (), merge_schema: bool = False
                ) -> None:
    """Refuse, before anything is written, a table the sink cannot write yet."""
    check_location(str(table.location()), f"the location of {identifier}")
    check_columns(table, identifier, schema, merge_schema)
    check_spec(table, identifier, partition)


def arrow_schema(table: Any) -> pa.Schema:
    """The table's schema in Arrow, with each column's Iceberg field ID (Parquet's
    ``field_id``), as pyiceberg's own writer puts it in every data file."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    schema = schema_to_pyarrow(table.schema(), include_field_ids=True)
    return pa.schema([f.with_type(_plain(f.type)) for f in schema], schema.metadata)


def _plain(kind: pa.DataType) -> pa.DataType:
    """Strings and binaries as pyiceberg's writer puts them in a file (not large ones,
    which Arrow's schema in the file would bring back on reading)."""
    if pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_large_binary(kind):
        return pa.binary()
    return kind


def parquet_options(table: Any) -> dict[str, Any]:
    """How pyiceberg's writer writes the table's Parquet files: the table's codec
    (``write.parquet.compression-codec``, zstd unless set) and level, decimals as
    integers."""
    properties = table.properties
    codec = properties.get("write.parquet.compression-codec", "zstd")
    level = properties.get("write.parquet.compression-level")
    return {"compression": "none" if codec == "uncompressed" else codec,
            "compression_level": int(level) if level else None,
            "store_decimal_as_integer": True}




_ROOTS: dict[tuple[str, str, str], str] = {}
"""Each table's location (``files.table_location``), by (catalog, identifier): Iceberg tables keep
their location (pyiceberg cannot move one), so a sweep or a rollback need not load the
table's metadata to find the attempts' manifests."""


def table_root(catalog: Any, identifier: str) -> str | None:
    """The table's location (``files.table_location``); None if there is no table."""
    key = (str(catalog.name), repr(sorted(catalog.properties.items())), identifier)
    if key not in _ROOTS:
        table = load_table(catalog, identifier)
        if table is None:
            return None
        _ROOTS[key] = table_location(str(table.location()))
    return _ROOTS[key]


__all__ = [
    "CATALOG_EXAMPLE",
    "arrow_schema",
    "check_table",
    "checked_catalog",
    "checked_identifier",
    "create_table",
    "load_table",
    "open_catalog",
    "parquet_options",
    "shown_uri",
    "table_root",
]
