"""A local service for a benchmark: the one named by its environment variable, or the
project's own (``docker/services/<script>``), started if it is not running and stopped
when the benchmark exits if the benchmark started it. A service left running would
hold its port, and the test suite's own start of it would fail."""

from __future__ import annotations

import atexit
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def service(script: str, var: str, key: str, env: dict[str, str] | None = None) -> str:
    """The ``key=`` value the service's ``start`` prints (its DSN, its bootstrap)."""
    if os.environ.get(var):
        return os.environ[var]
    path = os.path.join(ROOT, "docker", "services", script)
    running = subprocess.run(["bash", path, "status"], capture_output=True).returncode == 0
    out = subprocess.run(["bash", path, "start"], check=True, capture_output=True, text=True,
                         env=env).stdout
    if not running:
        atexit.register(subprocess.run, ["bash", path, "stop"], capture_output=True)
    match = re.search(rf"^{key}=(\S+)", out, re.MULTILINE)
    if not match:
        raise SystemExit(f"{script} printed no {key}=")
    return match.group(1)
