"""Each connector's format turns Spark's options and columns into its sink (no
services: the sinks are only built)."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pytest

from sparkeos.connectors.jdbc.format import PostgresFormat
from sparkeos.connectors.kafka.format import KafkaFormat
from sparkeos.connectors.sql.format import SqlFormat
from sparkeos.connectors.stomp.format import StompFormat
from sparkeos.core.errors import ConfigurationError, SchemaMismatchError
from sparkeos.core.storage.staging import checkpoint_staging_dir

CHECKPOINT = {"checkpointLocation": "/tmp/sparkeos-formats-test/ckpt"}


def schema(*names: str) -> pa.Schema:
    return pa.schema([(n, pa.binary() if n in ("key", "value", "body") else pa.string())
                      for n in names])


def sink(fmt: Any, options: dict[str, str], *columns: str) -> Any:
    return fmt(options={**CHECKPOINT, **options})._sink_and_settings(schema(*columns))[0]


def test_kafka_takes_sparks_options_and_columns() -> None:
    options = {"kafka.bootstrap.servers": "b:9092", "kafka.linger.ms": "5",
               "kafka.transaction.timeout.ms": "90000", "topic": "out"}
    made = sink(KafkaFormat, options, "key", "value", "headers", "topic")
    assert (made.bootstrap_servers, made.topic, made.topic_column) == ("b:9092", "out", None)
    assert (made.key_column, made.value_column, made.headers_column) == ("key", "value",
                                                                         "headers")
    assert made.producer_config == {"linger.ms": "5"}
    assert made.transaction_timeout_ms == 90000
    per_row = sink(KafkaFormat, {"kafka.bootstrap.servers": "b:9092"}, "value", "topic")
    assert (per_row.topic, per_row.topic_column, per_row.key_column) == (None, "topic", None)
    with pytest.raises(SchemaMismatchError, match="no 'value' column"):
        sink(KafkaFormat, options, "key", "payload")
    with pytest.raises(ConfigurationError, match="'partition' column"):
        sink(KafkaFormat, options, "value", "partition")
    with pytest.raises(ConfigurationError, match="needs a topic"):
        sink(KafkaFormat, {"kafka.bootstrap.servers": "b:9092"}, "value")
    with pytest.raises(ConfigurationError, match=r"kafka\.bootstrap\.servers"):
        sink(KafkaFormat, {"topic": "out"}, "value")


def test_postgres_takes_sparks_jdbc_options() -> None:
    made = sink(PostgresFormat, {"url": "jdbc:postgresql://db:5432/shop", "user": "app",
                                 "password": "p@ss", "dbtable": "orders",
                                 "sparkeos.mode": "upsert", "sparkeos.key": "id, day"},
                "id", "day")
    assert made.table == "orders" and made.mode == "upsert" and made.key == ("id", "day")
    assert "p@ss" not in str(made.describe())
    with pytest.raises(ConfigurationError, match="not a PostgreSQL URL"):
        sink(PostgresFormat, {"url": "jdbc:mysql://db/shop", "dbtable": "t"}, "id")


def test_stomp_stages_under_the_checkpoint() -> None:
    made = sink(StompFormat, {"url": "stomp://app@broker:61613", "destination": "orders",
                              "sparkeos.name": "events"}, "body", "headers")
    assert (made.destination, made.destination_column) == ("orders", None)
    assert (made.body_column, made.headers_column) == ("body", "headers")
    assert made.staging_dir == "/tmp/sparkeos-formats-test/ckpt/sparkeos-staging/events"
    by_row = sink(StompFormat, {"url": "stomp://app@broker:61613",
                                "sparkeos.destinationType": "none"}, "id", "destination")
    assert (by_row.destination_column, by_row.body_column) == ("destination", None)
    assert by_row.destination_type is None
    # Under the sink's name as the commit log has it; a relative checkpoint made
    # absolute (the tasks may run in another directory).
    relative = StompFormat(options={"url": "stomp://app@broker:61613", "destination": "o",
                                    "checkpointLocation": "ckpt"})
    made, settings = relative._sink_and_settings(schema("body"))
    assert made.staging_dir == checkpoint_staging_dir(os.path.abspath("ckpt"),
                                                      settings.config.name)
    assert os.path.isabs(made.staging_dir)


def test_sql_takes_a_sqlalchemy_url_and_a_table() -> None:
    made = sink(SqlFormat, {"url": "sqlite:////tmp/shop.db", "dbtable": "orders",
                            "sparkeos.createTable": "true"}, "id")
    assert (made.table, made.create_table, made.key) == ("orders", True, None)
    with pytest.raises(ConfigurationError, match="needs the option 'dbtable'"):
        sink(SqlFormat, {"url": "sqlite:////tmp/shop.db"}, "id")


def test_the_sql_formats_create_a_missing_table_as_sparks_jdbc_writer_does(
        tmp_path: Any) -> None:
    """Spark's jdbc writer creates a missing table in append mode; so do the formats,
    unless ``sparkeos.createTable=false``: then a missing table is a configuration error
    naming that option (the check runs before anything is written)."""
    postgres = {"url": "jdbc:postgresql://db:5432/shop", "dbtable": "orders"}
    assert sink(PostgresFormat, postgres, "id").create_table is True
    assert sink(PostgresFormat, {**postgres, "sparkeos.createTable": "false"},
                "id").create_table is False
    url = f"sqlite:///{tmp_path}/shop.db"
    made = sink(SqlFormat, {"url": url, "dbtable": "orders"}, "id")
    assert made.create_table is True
    made.validate(schema("id"))
    refusing = sink(SqlFormat, {"url": url, "dbtable": "other",
                                "sparkeos.createTable": "false"}, "id")
    with pytest.raises(ConfigurationError, match="does not exist") as refused:
        refusing.validate(schema("id"))
    assert not isinstance(refused.value, SchemaMismatchError)
    assert "sparkeos.createTable=true" in str(refused.value)
