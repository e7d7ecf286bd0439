"""Bytecode inside pyspark's ``python/lib`` zips, so Spark's Python processes stop
compiling pyspark each time they start.

Spark puts ``pyspark.zip`` and py4j's zip of the installed pyspark first on the path of
every Python process it starts: the daemon of each kind of worker, and for a Python data
source (every ``format("sparkeos-...")`` query) one more daemon each for the lookup of
the formats, the creation of the source, the planning of the write and the streaming
commits. Those zips hold sources only, and Python never writes bytecode into a zip: each
such process compiled the modules it imports from source (measured here: importing the
worker's modules 1.5 s from the zips as shipped, 0.76 s with bytecode, 0.53 s from
site-packages; a 5-batch ``format("sparkeos-parquet")`` job used 15 % less CPU).

    python -m sparkeos.testing.bytecode   # add it to the zips of the pyspark imported here

Each module's bytecode goes beside its source in the zip (``module.pyc``, where
``zipimport`` looks first), compiled by this interpreter as ``zipimport`` would compile
it without ``-O`` (``optimize=0``, whatever this process runs with), as an unchecked
hash-based ``.pyc`` (PEP 552): nothing of the code changes, only whether it is compiled
again. (``zipimport`` takes ``module.pyc`` under ``-O`` too: a worker started with
``-O`` keeps its asserts.) A zip already done for this interpreter is left alone; one
done for another is done again from its sources. ``./run`` does it once per virtual
environment and install (the tests, the demo, the benchmarks); a failure costs speed
only. Run it before Spark starts from that environment: a process importing from a zip
keeps the zip's offsets.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import tempfile
import warnings
import zipfile
from importlib import _bootstrap_external as _external
from typing import Any

_bootstrap_external: Any = _external

MARKER = "sparkeos-bytecode.txt"
"""The entry naming the interpreter the bytecode of a zip is for (its cache tag)."""


def compile_zip(path: str) -> bool:
    """Add bytecode for this interpreter to the zip at ``path`` (replaced whole, never
    half written); False if it had it already."""
    tag = sys.implementation.cache_tag
    with zipfile.ZipFile(path) as source:
        names = set(source.namelist())
        if MARKER in names and source.read(MARKER).decode() == tag:
            return False
        handle, temp = tempfile.mkstemp(prefix=".bytecode-", suffix=".zip",
                                        dir=os.path.dirname(path))
        os.close(handle)
        try:
            with zipfile.ZipFile(temp, "w", zipfile.ZIP_DEFLATED) as target:
                for info in source.infolist():
                    if info.filename == MARKER or (info.filename.endswith(".pyc")
                                                   and info.filename[:-1] in names):
                        continue  # another interpreter's
                    data = source.read(info.filename)
                    target.writestr(info, data)
                    if info.filename.endswith(".py"):
                        _add_bytecode(target, path, info, data)
                target.writestr(MARKER, tag)
            os.chmod(temp, os.stat(path).st_mode & 0o777)
            os.replace(temp, path)
        finally:
            if os.path.exists(temp):
                os.unlink(temp)
    return True


def _add_bytecode(target: zipfile.ZipFile, archive: str, info: zipfile.ZipInfo,
                  source: bytes) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pyspark's own tests hold SyntaxWarnings
        try:
            code = compile(source, os.path.join(archive, info.filename), "exec",
                           dont_inherit=True, optimize=0)
        except SyntaxError:
            return  # zipimport would fail on it as well; leave it to fail there
    data = _bootstrap_external._code_to_hash_pyc(  # what py_compile writes, in memory
        code, importlib.util.source_hash(source), checked=False)
    entry = zipfile.ZipInfo(info.filename + "c", date_time=info.date_time)
    entry.compress_type = zipfile.ZIP_STORED  # read at every start: no inflating
    target.writestr(entry, bytes(data))


def pyspark_zips() -> list[str]:
    """The zips Spark puts on its Python processes' path, of the pyspark imported here."""
    import pyspark

    lib = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
    return sorted(glob.glob(os.path.join(lib, "*.zip")))


def main() -> int:
    for path in pyspark_zips():
        done = compile_zip(path)
        print(f"{path}: {'bytecode added' if done else 'bytecode present'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
