"""Integration tests: real Spark (and real services for the connectors that need them).

Everything under integration/ gets the ``spark`` marker automatically. Chaos tests
(process kills and restarts) carry ``chaos``; ``./run quick`` leaves them out.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

if not os.environ.get("SPARKEOS_S3_ENDPOINT"):
    # The local object store takes any credentials, but a task finds them only in its
    # Python worker's environment, fixed when the first Spark process of the session
    # starts (the warm session's may start long before the first object-store test).
    from sparkeos.testing.s3a import LOCAL_CREDENTIALS

    for _name, _value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(_name, _value)


def machine_wide(item: pytest.Item) -> str | None:
    """The one-per-machine thing a test runs on, if any: the local Spark cluster (fixed
    ports, and its cores: a second application would wait for them), or a local Spark
    Connect server (pyspark starts it on port 15002). ``./run test`` runs two pytest
    workers; ``one_at_a_time`` lets one test at a time use each such thing. Everything
    else a test uses is its own (directories, topics, tables, queues, prefixes with a
    random part) or shared safely (``services.shared_local``)."""
    if "spark_cluster" in getattr(item, "fixturenames", ()):
        return "spark-cluster"
    cls = getattr(item, "cls", None)
    callspec = getattr(item, "callspec", None)
    code = callspec.params.get("code", "") if callspec is not None else ""
    if (item.get_closest_marker("connect") or getattr(cls, "connect", False)
            or (item.nodeid.startswith("integration/test_docs.py") and "sc://" in code)):
        return "spark-connect"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    root = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(root):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(autouse=True)
def one_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """An exclusive lock (flock, across the pytest sessions of this checkout) on the
    one-per-machine thing the test uses, held for the whole test."""
    thing = machine_wide(request.node)
    if thing is None:
        yield
        return
    import time

    from integration.fixtures.services import exclusive, services_dir
    from sparkeos.testing.joblog import log_time

    asked = time.monotonic()
    with exclusive(services_dir() / "locks" / f"{thing}.lock"):
        log_time(f"wait-{thing}", time.monotonic() - asked)  # the other worker held it
        yield


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[str]:
    """The plugin's standalone cluster, shared by the sessions of ``./run test``'s
    workers: the last one to leave stops it, if a session started it."""
    from integration.fixtures.services import shared_local
    from sparkeos.testing import cluster

    config = cluster.ClusterConfig.default()
    with shared_local("spark-cluster", lambda: cluster.status(config),
                      lambda: cluster.start(config), lambda: cluster.stop(config)) as master:
        yield master


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The services the session's fixtures stop side by side at its end."""
    from integration.fixtures import services

    for failure in services.wait_for_stops():
        print(f"\n[sparkeos] a service did not stop: {failure}", file=sys.stderr)


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive() -> None:
    """Spark starts from the test runs' Spark home (``sparkeos.testing.sparkhome``: its
    Python processes import pyspark from the virtual environment) and a class-data
    archive (made once per JDK and Spark: about 15 s), in this process and in every job
    it starts (they inherit the variables), and the drivers of those jobs with the JIT
    of short jobs, whatever makes their session."""
    from sparkeos.core.streaming.spark import CDS_ENV
    from sparkeos.testing.cds import ensure_archive
    from sparkeos.testing.job import short_job_submit_options
    from sparkeos.testing.sparkhome import shadow_home

    if os.environ.get("SPARK_HOME") is None:
        home = shadow_home(os.path.join(sys.prefix, "spark-home"))
        if home:
            os.environ["SPARK_HOME"] = home
    if os.environ.get(CDS_ENV) is None:
        archive = ensure_archive(os.path.join(sys.prefix, "spark-cds"))
        if archive:
            os.environ[CDS_ENV] = archive
    inherited, options = os.environ.get("SPARK_SUBMIT_OPTS", ""), short_job_submit_options()
    if options not in inherited:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{inherited} {options}".strip()


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """One local SparkSession for the in-process integration tests."""
    from sparkeos.core.streaming.spark import local_session
    from sparkeos.testing.job import LONG_SESSION_CONF

    session = local_session("sparkeos-integration", "local[2]", LONG_SESSION_CONF)
    yield session
    session.stop()

