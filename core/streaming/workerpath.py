"""What a Spark Python worker pays per task for the archives on its path, and how
sparkeos stops paying it.

Before each task a Python worker calls ``importlib.invalidate_caches()`` (pyspark's
``worker_util.setup_spark_files``), and on Python before 3.13 each ``zipimport``
importer then reads its archive's whole directory again, in Python. Spark puts two
kinds of archive on every worker's path (``PythonUtils.sparkPythonPath``):

- pyspark's own ``python/lib`` zips (pyspark 4.3's ``pyspark.zip``: 1,485 entries,
  14 ms of a core per read, read once for each package imported from it);
- the jar holding Spark's Python bridge (``spark-core_*.jar``: 5,973 entries, 60 ms per
  read, read twice: an import of the ``org`` namespace opens it a second time).

None of them changes while a worker lives, and Spark's jars hold no Python modules.
``steady_spark_archives``, called as each sparkeos task starts, gives each of them an
importer that does not read it again: a jar one that finds nothing, a zip one that keeps
the directory it read. A worker's first task pays as before; every later task in that
worker (Spark reuses them) no longer does. Measured with the 19 importers a worker holds
after a format task (pyspark 4.3, Python 3.11): 296 ms of a core per task -> 0.06 ms.
"""

from __future__ import annotations

import os
import sys
import zipimport
from typing import Any


class _NoModules:
    """The importer of one of Spark's jars: no Python module is there to find."""

    def find_spec(self, fullname: str, target: Any = None) -> None:
        return None

    def invalidate_caches(self) -> None:
        pass


class _SteadyZip(zipimport.zipimporter):
    """A zip that does not change while the worker lives: its directory is read once."""

    def invalidate_caches(self) -> None:
        pass


def steady_spark_archives() -> None:
    """Replace the importers of Spark's jars and pyspark's zips on this process's path
    (see the module's text). Cheap and idempotent: a few dict entries per call."""
    cache = sys.path_importer_cache
    for path, finder in list(cache.items()):
        if type(finder) is not zipimport.zipimporter:
            continue
        archive = str(finder.archive)
        try:
            if _is_spark_jar(archive):
                cache[path] = _NoModules()  # type: ignore[assignment]
            elif _is_pyspark_zip(archive):
                cache[path] = _SteadyZip(path)
        except (ImportError, OSError):
            continue  # gone meanwhile: the task runs as Spark made it, never fails here


def _is_spark_jar(archive: str) -> bool:
    # Spark's own jars (spark-core_2.13-4.3.0.jar...), wherever the cluster manager put
    # them (YARN: __spark_libs__/): none holds a Python module.
    name = os.path.basename(archive)
    return name.startswith("spark-") and name.endswith(".jar")


def _is_pyspark_zip(archive: str) -> bool:
    name = os.path.basename(archive)
    return (os.path.dirname(archive).endswith(os.path.join("python", "lib"))
            and (name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith(".zip"))))
