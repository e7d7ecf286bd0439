"""A Spark standalone cluster as local processes, from pyspark's own ``bin/spark-class``.

One master and two workers, the workers bound to distinct loopback addresses
(127.0.0.2 and 127.0.0.3 by default): Spark never places a speculative copy of a task
on the host of the original attempt, so speculation needs two hosts.

    python -m sparkeos.testing.cluster start     # prints master=spark://127.0.0.1:<port>
    python -m sparkeos.testing.cluster status    # exit 0 if running, 3 if not
    python -m sparkeos.testing.cluster stop      # TERM by pid file, then KILL

``docker/services/spark-cluster.sh`` is the same as a shell command. State (pid files,
logs, work directories) lives in ``$SPARKEOS_SERVICES_DIR/spark-cluster`` (default
``<repo>/.services`` when run from a checkout, else ``~/.sparkeos/services``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sparkeos.cli import pid_alive
from sparkeos.testing import sparkhome

MASTER_HOST = "127.0.0.1"
WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ClusterConfig:
    state_dir: Path
    master_port: int = int(os.environ.get("SPARKEOS_SPARK_MASTER_PORT", "27077"))
    master_ui_port: int = int(os.environ.get("SPARKEOS_SPARK_MASTER_UI_PORT", "28080"))
    worker_cores: int = int(os.environ.get("SPARKEOS_SPARK_WORKER_CORES", "2"))
    worker_memory: str = os.environ.get("SPARKEOS_SPARK_WORKER_MEMORY", "2g")
    worker_hosts: tuple[str, ...] = WORKER_HOSTS

    @property
    def master(self) -> str:
        return f"spark://{MASTER_HOST}:{self.master_port}"

    @classmethod
    def default(cls) -> ClusterConfig:
        configured = os.environ.get("SPARKEOS_SERVICES_DIR")
        if configured:
            base = Path(configured)
        else:
            repo = Path(__file__).resolve().parents[2]
            base = (repo / ".services") if (repo / "pyproject.toml").exists() else (
                Path.home() / ".sparkeos" / "services")
        return cls(base / "spark-cluster")


def spark_home() -> Path:
    """The test run's Spark home (``sparkeos.testing.sparkhome``)."""
    return Path(sparkhome.spark_home())


def _pid_file(config: ClusterConfig, name: str) -> Path:
    return config.state_dir / f"{name}.pid"


def _pids(config: ClusterConfig) -> dict[str, int]:
    found = {}
    for name in ("master", *(f"worker{i}" for i in range(len(config.worker_hosts)))):
        path = _pid_file(config, name)
        if path.exists():
            found[name] = int(path.read_text().strip())
    return found


def _alive_workers(config: ClusterConfig) -> int:
    url = f"http://{MASTER_HOST}:{config.master_ui_port}/json/"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            state = json.load(response)
    except (OSError, ValueError):
        return -1
    return int(state.get("aliveworkers", 0))


def status(config: ClusterConfig) -> bool:
    pids = _pids(config)
    expected = 1 + len(config.worker_hosts)
    return len(pids) == expected and all(pid_alive(p) for p in pids.values()) and (
        _alive_workers(config) == len(config.worker_hosts))


def _launch(config: ClusterConfig, name: str, host: str, args: list[str]) -> None:
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": host,
           "SPARK_DAEMON_MEMORY": os.environ.get("SPARKEOS_SPARK_DAEMON_MEMORY", "256m"),
           "SPARK_NO_DAEMONIZE": "1"}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    log = open(config.state_dir / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [str(spark_home() / "bin" / "spark-class"), *args], env=env, stdout=log,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        cwd=config.state_dir)
    _pid_file(config, name).write_text(f"{proc.pid}\n")


def _check_hosts(config: ClusterConfig) -> None:
    for host in (MASTER_HOST, *config.worker_hosts):
        with socket.socket() as probe:
            try:
                probe.bind((host, 0))
            except OSError as exc:
                raise SystemExit(f"cannot bind {host} ({exc}); the workers need distinct "
                                 "loopback addresses (Linux routes all of 127.0.0.0/8)") from None


def start(config: ClusterConfig) -> str:
    if status(config):
        return config.master
    stop(config)
    config.state_dir.mkdir(parents=True, exist_ok=True)
    _check_hosts(config)
    _launch(config, "master", MASTER_HOST, [
        "org.apache.spark.deploy.master.Master", "--host", MASTER_HOST,
        "--port", str(config.master_port), "--webui-port", str(config.master_ui_port)])
    for i, host in enumerate(config.worker_hosts):
        work = config.state_dir / f"work{i}"
        work.mkdir(exist_ok=True)
        _launch(config, f"worker{i}", host, [
            "org.apache.spark.deploy.worker.Worker", "--host", host,
            "--cores", str(config.worker_cores), "--memory", config.worker_memory,
            "--work-dir", str(work), "--webui-port", "0", config.master])
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if status(config):
            return config.master
        dead = [n for n, p in _pids(config).items() if not pid_alive(p)]
        if dead:
            break
        time.sleep(0.5)
    logs = "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-2000:]
                     for p in sorted(config.state_dir.glob("*.log")))
    stop(config)
    raise SystemExit(f"the Spark cluster did not come up within {START_TIMEOUT_S:.0f} s\n{logs}")


def stop(config: ClusterConfig) -> None:
    pids = _pids(config)
    for pid in pids.values():
        if pid_alive(pid):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while any(pid_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids.values():
        if pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)
    for name in pids:
        _pid_file(config, name).unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    config = ClusterConfig.default()
    command = argv[0] if argv else "status"
    if command == "start":
        print(f"master={start(config)}")
        return 0
    if command == "status":
        running = status(config)
        print(f"master={config.master}" if running else "not running")
        return 0 if running else 3
    if command == "stop":
        stop(config)
        return 0
    print("usage: python -m sparkeos.testing.cluster start|status|stop", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
