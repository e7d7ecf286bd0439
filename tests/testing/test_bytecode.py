"""sparkeos.testing.bytecode: a zip of sources gains bytecode that zipimport takes, the
code unchanged; a zip done once is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from sparkeos.testing.bytecode import MARKER, compile_zip


def _import_from(archive: str, module: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", f"import {module} as m; print(m.__file__, m.answer())"],
        env={**os.environ, "PYTHONPATH": archive}, capture_output=True, text=True,
        check=True)
    return out.stdout.strip()


def test_a_zip_of_sources_gains_bytecode_that_zipimport_takes(tmp_path):
    archive = str(tmp_path / "lib.zip")
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
        zf.writestr("pkg/mod.py", "def answer():\n    return 42\n")
    assert _import_from(archive, "pkg.mod") == f"{archive}/pkg/mod.py 42"

    assert compile_zip(archive)
    assert _import_from(archive, "pkg.mod") == f"{archive}/pkg/mod.pyc 42"
    with zipfile.ZipFile(archive) as zf:
        assert {"pkg/__init__.pyc", "pkg/mod.pyc", MARKER} <= set(zf.namelist())
        assert zf.getinfo("pkg/mod.pyc").compress_type == zipfile.ZIP_STORED

    assert not compile_zip(archive)  # done for this interpreter: left as it is


def test_bytecode_of_another_interpreter_is_replaced_and_bad_sources_left(tmp_path):
    archive = str(tmp_path / "lib.zip")
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("mod.py", "def answer():\n    return 7\n")
        zf.writestr("mod.pyc", b"not bytecode of this interpreter")
        zf.writestr("broken.py", "def (:\n")
        zf.writestr(MARKER, "cpython-0")
    assert compile_zip(archive)
    with zipfile.ZipFile(archive) as zf:
        assert zf.read(MARKER).decode() == sys.implementation.cache_tag
        assert "broken.pyc" not in zf.namelist()
        assert zf.namelist().count("mod.pyc") == 1
    assert _import_from(archive, "mod") == f"{archive}/mod.pyc 7"
