"""Spark's built-in Kafka source, set up for exactly-once pipelines.

The replayable half of the guarantee: Spark keeps the source offsets of every
micro-batch in its checkpoint and re-reads exactly the same records when it re-runs a
batch. ``kafka.isolation.level=read_committed`` makes the source skip records of
aborted (and not yet committed) transactions, so Kafka -> Spark -> Kafka pipelines
see only committed output of upstream transactional producers.

The source lives in Spark's ``spark-sql-kafka-0-10`` connector jar (not bundled with
pyspark): give its jars to the session with ``spark.jars`` (``spark_kafka_jars()``)
or ``spark.jars.packages``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

from sparkeos.core.errors import ConfigurationError

JARS_ENV = "SPARKEOS_SPARK_JARS"
_SCRIPT = os.path.join("docker", "services", "kafka.sh")


def _repo_root() -> str | None:
    """The source checkout this package runs from (connectors/kafka/ -> root)."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    return root if os.path.isfile(os.path.join(root, _SCRIPT)) else None


def spark_kafka_jars(*, fetch: bool = True) -> list[str]:
    """Jar files of Spark's Kafka connector, for ``spark.jars`` (joined with commas).

    In order: ``$SPARKEOS_SPARK_JARS`` (comma-separated paths); else, in a source
    checkout, ``bash docker/services/kafka.sh spark-jars`` (downloads them from Maven
    Central once, if ``fetch``). Raises ``ConfigurationError`` naming the fix otherwise.
    """
    configured = os.environ.get(JARS_ENV, "").strip()
    if configured:
        jars = [j.strip() for j in configured.split(",") if j.strip()]
        missing = [j for j in jars if not os.path.isfile(j)]
        if missing:
            raise ConfigurationError(
                f"${JARS_ENV} names jars that do not exist: {', '.join(missing)}",
                fix=f"fix ${JARS_ENV} (comma-separated jar paths) or unset it",
            )
        return jars
    root = _repo_root()
    if root is not None and fetch:
        try:
            out = subprocess.run(
                ["bash", os.path.join(root, _SCRIPT), "spark-jars"], cwd=root,
                capture_output=True, text=True, timeout=900, check=True,
            ).stdout
            jars = [j for j in out.strip().splitlines()[-1].split(",") if j] if out else []
            if jars and all(os.path.isfile(j) for j in jars):
                return jars
            problem = f"{_SCRIPT} spark-jars printed no usable jar list"
        except subprocess.CalledProcessError as exc:
            problem = f"{_SCRIPT} spark-jars failed: {(exc.stderr or '').strip()[-500:]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = f"{_SCRIPT} spark-jars could not run: {exc}"
    else:
        problem = "no connector jars configured"
    raise ConfigurationError(
        f"Spark's Kafka connector jars were not found ({problem})",
        fix=f"set ${JARS_ENV} to the comma-separated jar paths, run `bash {_SCRIPT} fetch` "
        "in the sparkeos checkout (needs Maven Central), or start Spark with "
        "spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:<Spark version>",
    )


def kafka_source(
    spark: Any,
    bootstrap_servers: str,
    topics: str | Iterable[str] | None = None,
    *,
    pattern: str | None = None,
    starting_offsets: str = "earliest",
    isolation_level: str = "read_committed",
    fail_on_data_loss: bool = True,
    consumer_config: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """A streaming DataFrame over Kafka (Spark's built-in source) for exactly-once jobs.

    ``topics``: a name, a comma-separated list or an iterable (``subscribe``); or
    ``pattern`` (``subscribePattern``). ``starting_offsets``: where a *new* query starts
    (``"earliest"`` by default, so nothing already in the topic is skipped; a restarted
    query always continues from its checkpoint). ``consumer_config``: Kafka consumer
    settings (SASL/SSL...), passed as ``kafka.<key>``. Other keyword arguments are Spark
    source options as they are (``maxOffsetsPerTrigger=10000``...).

    The columns are Spark's: key, value (binary), topic, partition, offset, timestamp,
    timestampType (and headers with ``includeHeaders=true``).
    """
    _check_arguments(bootstrap_servers, topics, pattern, isolation_level)
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", bootstrap_servers)
              .option("kafka.isolation.level", isolation_level)
              .option("startingOffsets", starting_offsets)
              .option("failOnDataLoss", str(fail_on_data_loss).lower()))
    if topics is not None:
        names = topics if isinstance(topics, str) else ",".join(topics)
        reader = reader.option("subscribe", names)
    else:
        reader = reader.option("subscribePattern", pattern)
    for key, value in (consumer_config or {}).items():
        reader = reader.option(key if key.startswith("kafka.") else f"kafka.{key}", str(value))
    for key, value in options.items():
        reader = reader.option(key, str(value).lower() if isinstance(value, bool) else value)
    return _load(reader)


def _check_arguments(bootstrap_servers: str, topics: str | Iterable[str] | None,
                     pattern: str | None, isolation_level: str) -> None:
    if not bootstrap_servers:
        raise ConfigurationError("kafka_source needs bootstrap_servers")
    if isolation_level not in ("read_committed", "read_uncommitted"):
        raise ConfigurationError(
            f"unknown isolation_level {isolation_level!r}",
            fix="use 'read_committed' (exactly-once pipelines) or 'read_uncommitted'",
        )
    if (topics is None) == (pattern is None):
        raise ConfigurationError(
            "kafka_source needs exactly one of topics= and pattern=",
            fix="kafka_source(spark, servers, 'in') or kafka_source(spark, servers, "
            "pattern='in-.*')",
        )


def _load(reader: Any) -> Any:
    """``reader.load()``; a missing connector jar becomes a ``ConfigurationError``."""
    try:
        return reader.load()
    except Exception as exc:
        text = str(exc)
        if "Failed to find data source" in text or "DATA_SOURCE_NOT_FOUND" in text:
            raise ConfigurationError(
                "Spark's Kafka source is not on the classpath of this SparkSession",
                fix="build the session with .config('spark.jars', ','.join("
                "spark_kafka_jars())) (or spark.jars.packages=org.apache.spark:"
                "spark-sql-kafka-0-10_2.13:<Spark version>) before the first getOrCreate()",
            ) from None
        raise
