"""Where the fixtures take PostgreSQL, Kafka and Artemis from (integration/fixtures/
services.py): the order env, containers, local, and SPARKEOS_SERVICES forcing one path
loudly. The Docker engine is replaced by a stand-in with a set of local images: what is
tested is the choice, not Docker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import docker.errors
import pytest

from integration.fixtures import services
from integration.fixtures.services import KAFKA, POSTGRES, choice


class Images:
    def __init__(self, present: set[str]) -> None:
        self.present = present

    def get(self, name: str) -> str:
        if name not in self.present:
            raise docker.errors.ImageNotFound(name)
        return name

    def list(self, name: str) -> list[Any]:
        return [type("Image", (), {"tags": [tag]})() for tag in sorted(self.present)
                if tag.split(":")[0] == name]


class Engine:
    def __init__(self, *images: str) -> None:
        self.images = Images(set(images))


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Sets the engine the choice sees: ``engine(None)`` for none, ``engine(Engine(...))``."""
    for name in ("SPARKEOS_SERVICES", "SPARKEOS_PULL_IMAGES", POSTGRES.env_var,
                 POSTGRES.image_var, KAFKA.env_var, KAFKA.image_var):
        monkeypatch.delenv(name, raising=False)

    def use(fake: Engine | None) -> None:
        reason = "" if fake else "no Docker engine answers (test)"
        monkeypatch.setattr(services, "docker_client", lambda: (fake, reason))
        choice.cache_clear()

    yield use
    choice.cache_clear()


def test_a_variable_comes_first(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine(Engine("sparkeos/postgres:17"))
    monkeypatch.setenv(POSTGRES.env_var, "postgresql://u@db:5432/x")
    assert choice(POSTGRES) == services.Choice("env", POSTGRES.env_var)


def test_then_a_local_image_then_the_local_process(engine: Any) -> None:
    engine(Engine("sparkeos/postgres:15", "sparkeos/postgres:17", "postgres:17"))
    assert choice(POSTGRES) == services.Choice("containers", "sparkeos/postgres:17")
    engine(Engine("postgres:17"))
    assert choice(POSTGRES) == services.Choice("containers", "postgres:17")
    engine(Engine())  # an engine, but no image: nothing is pulled
    assert choice(POSTGRES) == services.Choice("local", "docker/services/postgres.sh")
    engine(None)
    assert choice(KAFKA) == services.Choice("local", "docker/services/kafka.sh")


def test_an_image_is_pulled_only_when_allowed(engine: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KAFKA.image_var, "example/kafka:9")
    engine(Engine())
    assert choice(KAFKA).path == "local"
    monkeypatch.setenv("SPARKEOS_PULL_IMAGES", "1")
    engine(Engine())
    assert choice(KAFKA) == services.Choice("containers", "example/kafka:9")


def test_a_forced_path_that_cannot_be_had_says_why(engine: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKEOS_SERVICES", "containers")
    engine(None)
    assert "no Docker engine answers" in str(choice(POSTGRES).error)
    engine(Engine())
    error = str(choice(POSTGRES).error)
    assert "docker/images/build.sh" in error and "SPARKEOS_PULL_IMAGES=1" in error
    with pytest.raises(pytest.fail.Exception, match="SPARKEOS_SERVICES=containers cannot"):
        choice(POSTGRES).require(POSTGRES)

    monkeypatch.setenv("SPARKEOS_SERVICES", "env")
    engine(Engine("sparkeos/postgres:17"))  # an image does not stand in for the variable
    assert choice(POSTGRES).error == f"{POSTGRES.env_var} is not set"

    monkeypatch.setenv("SPARKEOS_SERVICES", "local")
    monkeypatch.setenv(POSTGRES.env_var, "postgresql://u@db:5432/x")
    choice.cache_clear()
    assert choice(POSTGRES) == services.Choice("local", "docker/services/postgres.sh")


def test_an_unknown_path_is_a_usage_error(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKEOS_SERVICES", "docker")
    engine(None)
    with pytest.raises(pytest.UsageError, match="expected one of env, containers, local"):
        choice(POSTGRES)
