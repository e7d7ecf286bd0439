"""StompSink runs the conformance suite on real Spark and a real ActiveMQ Artemis.

``visible_ids`` is what a consumer of the output queue receives: every message's body
is the input row as JSON (``{"id": ..., "payload": ...}``). The queue is drained into
the test's own list (a queue gives each message once), counted exactly by the broker's
own counters first, so no wait depends on timing.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
import uuid
from typing import Any

import pytest

from integration.fixtures.clouds import StagingOnCloud, StoreCasesOnly
from integration.fixtures.s3 import StagingOnS3
from integration.stomp_helpers import drain, queue_depth_artemis
from sparkeos.connectors.stomp import StompSink
from sparkeos.connectors.stomp.client import Endpoint
from sparkeos.testing.conformance import (
    ConnectorConformance,
    InProcessConformance,
    SampledDriverKills,
    SampledFormatConformance,
)
from sparkeos.testing.storefaults import StoreWireFaultCases
from sparkeos.testing.tcpproxy import LOST_REPLY, RESET, STOMP, WireFault
from sparkeos.testing.wirefaults import WireFaultConformance


def output_depth(url: str, queue: str, local: bool) -> int | None:
    """Messages in ``queue`` by the broker's counters (None for a remote broker)."""
    if not local:
        return None
    try:
        return queue_depth_artemis(queue, url)
    except LookupError:
        return 0


class TestStompSinkArtemis(SampledDriverKills, ConnectorConformance):
    url: str
    queue: str
    local: bool
    received: list[int]

    @pytest.fixture(autouse=True)
    def _artemis(self, artemis_url: str, local_artemis: bool) -> None:
        self.url = artemis_url
        self.local = local_artemis
        self.queue = f"seos-test-{uuid.uuid4().hex[:10]}"
        self.received = []

    def sink_spec(self, workdir: str) -> dict[str, Any]:
        return {"factory": "sparkeos.connectors.stomp:StompSink",
                "kwargs": {"url": self.url, "destination": self.queue,
                           "staging_dir": os.path.join(workdir, "staging")}}

    def plain_spec(self, workdir: str) -> dict[str, Any] | None:
        return {"factory": "sparkeos.connectors.stomp.plain:plain_foreachbatch_writer",
                "kwargs": {"url": self.url, "destination": self.queue}}

    soak_batches_default = 150

    def bookkeeping(self, workdir: str) -> dict[str, int]:
        published = os.path.join(workdir, "staging", "published")
        return {"published_records": len(os.listdir(published))
                if os.path.isdir(published) else 0}

    def bookkeeping_bounds(self) -> dict[str, int]:
        return {"published_records": 4}  # one per pooled participant ID: 2 x 2

    def recover_settings(self, workdir: str) -> dict[str, str]:
        passcode = self.sink_factory(workdir).endpoint.passcode  # type: ignore[attr-defined]
        return {"passcode": passcode} if passcode else {}

    def leftovers(self, workdir: str) -> list[str] | None:
        staging = os.path.join(workdir, "staging")
        names = os.listdir(staging) if os.path.isdir(staging) else []
        return sorted(n for n in names if not n.startswith(".") and n != "published")

    def visible_ids(self, workdir: str) -> list[int]:
        depth = output_depth(self.url, self.queue, self.local)
        if depth is None or depth > 0:
            messages = drain(self.url, self.queue, expect=depth, timeout=120.0)
            self.received += [int(json.loads(m.body)["id"]) for m in messages]
        return list(self.received)


class TestStompWireFaults(WireFaultConformance, TestStompSinkArtemis):
    """Issue 37: the sink's connections through a fault proxy, one step of phase 2's
    publish hurt per case: the RECEIPT of the last SEND (which confirms them all) lost
    after the broker stored every message, and the connection reset before that last
    SEND. The commit task fails with the outcome unknown and is retried: it sends every
    message again under the same duplicate IDs, and Artemis drops those it has."""

    wire_protocol = STOMP
    wire_steps = ("receipt_lost", "reset_before_last_send")

    def wire_upstream(self) -> str:
        return Endpoint.parse(self.url).address

    def wire_sink(self, workdir: str, address: str) -> StompSink:
        parts = urllib.parse.urlsplit(self.url)
        login = parts.netloc.rpartition("@")[0]
        url = urllib.parse.urlunsplit(
            parts._replace(netloc=f"{login}@{address}" if login else address))
        return StompSink(**{**self.sink_spec(workdir)["kwargs"], "url": url})

    def wire_faults(self, step: str) -> list[WireFault]:
        # The last SEND of a publish to this test's queue: the one with the receipt.
        last_send = rf"^SEND (?=.*\bdestination:{re.escape(self.queue)}\b)(?=.*\breceipt:)"
        return {
            "receipt_lost": [WireFault(LOST_REPLY, last_send)],
            "reset_before_last_send": [WireFault(RESET, last_send)],
        }[step]


class TestStompFormat(SampledFormatConformance, TestStompSinkArtemis):
    """The sink through ``writeStream.format("sparkeos-stomp")``: phase 2 publishes
    from the process Spark commits the batch in."""

    def format_spec(self, workdir: str) -> dict[str, Any]:
        return {"format": "sparkeos-stomp",
                "options": {"url": self.url, "destination": self.queue,
                            "sparkeos.stagingDir": os.path.join(workdir, "staging")}}


@pytest.mark.s3
class TestStompSinkStagedS3(StoreWireFaultCases, InProcessConformance, StagingOnS3,
                            TestStompSinkArtemis):
    """Staging and the PUBLISHED records on an S3-compatible object store: every
    in-process case (the crash matrix, concurrent attempts, twin commits, sweeps)
    against the store and the broker. The Spark cases reach the store the same way as
    the Kafka sink's staged S3 variant, whose staging is the same ``StagingArea``; the
    soak (bookkeeping stays bounded) is the plain suite's."""

    test_soak_many_tiny_batches_stay_bounded = None
    # The replay rule is the sink's: one case of it with the records on the store.
    test_exactly_once_replay_partitioned_otherwise = None
    test_at_least_once_replay_partitioned_as_before_loses_nothing = None
    test_at_least_once_replay_shuffled_writes_nothing_again = None
    test_at_least_once_queries_are_told_apart_by_spark_query_id = None
    test_a_switch_to_exactly_once_over_a_half_written_batch = None

    def leftovers(self, workdir: str) -> list[str] | None:
        return [n for n in self.s3_names(self.staging(workdir)) if n != "published"]


@pytest.mark.clouds
class TestStompSinkStagedGcs(StoreWireFaultCases, StoreCasesOnly, StagingOnCloud,
                             TestStompSinkArtemis):
    """Staging and the PUBLISHED records on an emulated Google Cloud Storage: the
    store's cases only; the whole in-process matrix on a store is the S3 variant's."""

    cloud_name = "gcs"
    # The store's races and zombies are the file sink's on GCS (test budget).
    test_two_commits_of_one_transaction_at_every_pair_of_steps = None
    test_zombie_attempt_never_becomes_visible = None

    def leftovers(self, workdir: str) -> list[str] | None:
        return [n for n in self.cloud_names(self.staging(workdir)) if n != "published"]
