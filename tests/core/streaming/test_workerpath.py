"""core.streaming.workerpath: Spark's jars and pyspark's zips on a worker's path are
no longer read again at each task's ``importlib.invalidate_caches()``."""

from __future__ import annotations

import importlib
import os
import sys
import zipfile
import zipimport
from typing import Any

import pytest

from sparkeos.core.streaming.workerpath import steady_spark_archives


@pytest.fixture
def archives(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A Spark jar, pyspark's zips and a user's zip on the path, each with its importer."""
    paths = {"jar": tmp_path / "jars" / "spark-core_2.13-4.3.0.jar",
             "pyspark": tmp_path / "python" / "lib" / "pyspark.zip",
             "py4j": tmp_path / "python" / "lib" / "py4j-0.10.9.9-src.zip",
             "user": tmp_path / "deps.zip"}
    for name, path in paths.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(f"sparkeos_probe_{name}.py", "VALUE = 1\n")
    for path in paths.values():
        monkeypatch.syspath_prepend(str(path))
    monkeypatch.setattr(sys, "path_importer_cache", {})
    for path in paths.values():
        sys.path_importer_cache[str(path)] = zipimport.zipimporter(str(path))
    return {name: str(path) for name, path in paths.items()}


def test_spark_archives_are_not_read_again(archives: dict[str, str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    steady_spark_archives()
    steady_spark_archives()  # idempotent
    reads: list[str] = []
    original = zipimport._read_directory  # type: ignore[attr-defined]

    def counted(archive: str) -> Any:
        reads.append(os.path.basename(archive))
        return original(archive)

    monkeypatch.setattr(zipimport, "_read_directory", counted)
    importlib.invalidate_caches()
    assert reads == ["deps.zip"]  # only the user's zip, which may change


def test_pyspark_zips_still_import_and_the_jar_finds_nothing(
        archives: dict[str, str]) -> None:
    steady_spark_archives()
    cache = sys.path_importer_cache
    assert cache[archives["jar"]].find_spec("sparkeos_probe_jar") is None  # type: ignore[union-attr]
    for name in ("pyspark", "py4j", "user"):
        module = f"sparkeos_probe_{name}"
        try:
            assert importlib.import_module(module).VALUE == 1
        finally:
            sys.modules.pop(module, None)


def test_an_archive_gone_meanwhile_is_left_as_it_was(archives: dict[str, str]) -> None:
    os.unlink(archives["pyspark"])
    steady_spark_archives()  # must not fail the task
    assert type(sys.path_importer_cache[archives["pyspark"]]) is zipimport.zipimporter
