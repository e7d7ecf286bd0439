#!/usr/bin/env bash
# A Spark standalone cluster as local processes (no Docker): one master on 127.0.0.1
# and two workers on 127.0.0.2 and 127.0.0.3 (distinct hosts, so Spark can place a
# speculative copy of a task away from its original), from pyspark's bin/spark-class.
#
#   bash docker/services/spark-cluster.sh start    # start, wait for both workers, print
#                                                  # master=spark://127.0.0.1:<port>
#   bash docker/services/spark-cluster.sh status   # exit 0 if running, 3 if not
#   bash docker/services/spark-cluster.sh stop     # TERM by pid file, then KILL
#
# Environment:
#   SPARKEOS_PYTHON                 the interpreter with pyspark (default <repo>/.venv/bin/python)
#   SPARKEOS_SERVICES_DIR           default <repo>/.services (state in spark-cluster/)
#   SPARKEOS_SPARK_MASTER_PORT      default 27077 (web UI: SPARKEOS_SPARK_MASTER_UI_PORT, 28080)
#   SPARKEOS_SPARK_WORKER_CORES     default 2;  SPARKEOS_SPARK_WORKER_MEMORY  default 2g
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${SPARKEOS_PYTHON:-$REPO/.venv/bin/python}"
if [ ! -x "$PY" ]; then
  echo "spark-cluster.sh: $PY not found; run ./run setup first (or set SPARKEOS_PYTHON)" >&2
  exit 2
fi
export SPARKEOS_SERVICES_DIR="${SPARKEOS_SERVICES_DIR:-$REPO/.services}"
exec "$PY" -m sparkeos.testing.cluster "$@"
