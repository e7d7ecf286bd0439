"""Helpers of the Kafka tests; the ``kafka_bootstrap`` fixture is in integration/fixtures."""

from integration.fixtures.kafka import ROOT, create_topic, unique_name

__all__ = ["ROOT", "create_topic", "unique_name"]
