"""A Spark home for test runs, whose Python processes import pyspark from the virtual
environment instead of from pyspark's zips.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on the path of
every Python process it starts: each kind of worker's daemon and the workers it forks,
and for a Python data source (every ``format("sparkeos-...")`` query) a daemon more for
each of the lookup, the creation, the write's planning and the streaming commits. Two
costs follow, measured here with pyspark 4.3:

- before each task, the worker's ``setup_spark_files`` calls
  ``importlib.invalidate_caches()``, and ``zipimport`` then reads the zip's whole
  directory again, in Python, once for each package imported from it (14 ms each for
  the 1,485 entries of pyspark 4.3's zip; ``core.streaming.workerpath`` spares a
  sparkeos task's successors this, not a worker's first task);
- the zips hold sources only, so each daemon compiles what it imports.

The installed pyspark holds the same modules (the zips add only pyspark's own tests), with
their bytecode. A test run's ``SPARK_HOME`` is therefore a directory beside the virtual
environment: a symbolic link to each entry of the installed pyspark, but ``python/lib``,
whose zips keep their names and hold nothing. The file format's driver-kill case, against
the zips as an earlier bytecode step of ``./run`` had left them: the Python workers' CPU
48 -> 36 s, the case 93 -> 82 s. The demo and the benchmarks run
pyspark as installed, as users do.

    python -m sparkeos.testing.sparkhome [DIRECTORY]   # make it if missing; print it
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import zipfile

from sparkeos.testing.once import made_once

ZIPS = os.path.join("python", "lib")
LAYOUT = 1
"""The layout ``_populate`` makes: a new number makes new directories."""


def installed_home() -> str:
    """The installed pyspark's directory: Spark's home when none is set."""
    import pyspark

    return os.path.dirname(os.path.realpath(pyspark.__file__))


def spark_home() -> str:
    """``$SPARK_HOME`` when set (a test run's, ``shadow_home``), else pyspark's own."""
    return os.environ.get("SPARK_HOME") or installed_home()


def shadow_home(directory: str) -> str | None:
    """The test runs' Spark home for the installed pyspark in ``directory``, made first
    if missing; None if it cannot be made (Spark then runs from pyspark's own)."""
    import pyspark

    source = installed_home()
    digest = hashlib.sha256(f"{LAYOUT}\n{pyspark.__version__}\n{source}\n"
                            f"{sorted(os.listdir(source))}".encode())
    return made_once(os.path.join(directory, f"spark-home-{digest.hexdigest()[:16]}"),
                     lambda path: _make(path, source))


def _make(path: str, source: str) -> str | None:
    temp = tempfile.mkdtemp(prefix=".spark-home-", dir=os.path.dirname(path))
    try:
        os.chmod(temp, 0o755)
        _populate(temp, source)
        os.rename(temp, path)
    except OSError:
        shutil.rmtree(temp, ignore_errors=True)
        return None
    return path


def _populate(target: str, source: str) -> None:
    _link_entries(source, target, but="python")
    os.makedirs(os.path.join(target, ZIPS))
    _link_entries(os.path.join(source, "python"), os.path.join(target, "python"), but="lib")
    zips = os.path.join(source, ZIPS)
    for name in os.listdir(zips) if os.path.isdir(zips) else []:
        if name.endswith(".zip"):
            zipfile.ZipFile(os.path.join(target, ZIPS, name), "w").close()



def _link_entries(source: str, target: str, but: str) -> None:
    """A link in ``target`` to each entry of ``source`` but ``but``."""
    for name in os.listdir(source) if os.path.isdir(source) else []:
        if name != but:
            os.symlink(os.path.join(source, name), os.path.join(target, name))


if __name__ == "__main__":
    home = shadow_home(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(sys.prefix, "spark-home"))
    print(home or "no Spark home made: Spark runs from pyspark's own")
    raise SystemExit(0 if home else 1)
