"""sparkeos.testing.sparkhome: the test runs' Spark home links every entry of the
installed pyspark but its zips, which keep their names and hold nothing."""

from __future__ import annotations

import os
import zipfile
from typing import Any

from sparkeos.testing import sparkhome


def test_the_home_links_pyspark_and_empties_its_zips(tmp_path: Any) -> None:
    installed = sparkhome.installed_home()
    home = sparkhome.shadow_home(str(tmp_path))
    assert home is not None and home.startswith(str(tmp_path))
    assert os.path.realpath(os.path.join(home, "jars")) == os.path.join(installed, "jars")
    assert os.path.isfile(os.path.join(home, "bin", "spark-submit"))
    zips = sorted(os.listdir(os.path.join(installed, "python", "lib")))
    assert zips and sorted(os.listdir(os.path.join(home, "python", "lib"))) == zips
    for name in zips:
        path = os.path.join(home, "python", "lib", name)
        assert not os.path.islink(path)
        assert zipfile.ZipFile(path).namelist() == []
    assert sparkhome.shadow_home(str(tmp_path)) == home  # made once
    assert [n for n in os.listdir(tmp_path) if n.startswith(".spark-home-")] == []


def test_spark_home_is_the_variable_when_set(monkeypatch: Any) -> None:
    monkeypatch.setenv("SPARK_HOME", "/somewhere")
    assert sparkhome.spark_home() == "/somewhere"
    monkeypatch.delenv("SPARK_HOME")
    assert sparkhome.spark_home() == sparkhome.installed_home()



def test_no_home_where_the_directory_cannot_be_made(tmp_path: Any) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert sparkhome.shadow_home(str(blocker / "homes")) is None  # no raise: no home
