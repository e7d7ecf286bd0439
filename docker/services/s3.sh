#!/usr/bin/env bash
# A local S3-compatible object store for development and integration tests, as a local
# process: moto's S3 server (PyPI), behind sparkeos.testing.s3server, which makes every
# write atomic against the others so `If-None-Match: *` holds under concurrent writers
# (docs/connectors/file.md, "Object stores", has the measured behaviour).
#
#   bash docker/services/s3.sh start    # pip install moto into the project's venv if missing, start, wait
#   bash docker/services/s3.sh status   # exit 0 if running, 3 if not
#   bash docker/services/s3.sh stop     # TERM by pid file, then KILL
#   bash docker/services/s3.sh spark-jars  # comma-separated jars for spark.jars: Hadoop's S3A
#
# spark-jars fetches, once, hadoop-aws at the version of the Hadoop client pyspark bundles
# and the AWS SDK v2 modules S3A loads (s3, s3-transfer-manager for its copies, the
# analytics accelerator its request auditing names): 35 jars, 12 MB, in one Maven run
# into .services/s3a-jars. Not the SDK's "bundle" jar hadoop-aws declares (686 MB), and
# none of what pyspark ships (netty, httpclient, commons-*, slf4j).
#
# start prints "s3=http://127.0.0.1:<port>" on stdout. Any access key and secret are
# accepted (the tests use AWS_ACCESS_KEY_ID=sparkeos, AWS_SECRET_ACCESS_KEY=sparkeos);
# buckets are made by their users. Data lives in memory: a restart starts empty.
#
# Environment:
#   SPARKEOS_SERVICES_DIR        default <repo>/.services
#   SPARKEOS_S3_PORT             default 29900
#   SPARKEOS_S3_PYTHON           the Python that runs it, default <repo>/.venv/bin/python
#   SPARKEOS_S3_INSTANCE         a second server beside the default one, under
#                                .services/s3-<instance> (give it another port)
#   SPARKEOS_S3_NO_CONDITIONAL   1: the server ignores If-None-Match (a store sparkeos refuses)
#   SPARKEOS_S3_START_TIMEOUT    seconds, default 60
#   SPARKEOS_HADOOP_VERSION      default: the hadoop-client-api jar pyspark bundles
#   SPARKEOS_S3A_SDK_VERSION     AWS SDK v2 version hadoop-aws was built with (known for
#                                Hadoop 3.5.0: 2.35.4; required for other versions)
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # REPO, SERVICES_DIR, HOST, log, die, take_lock, pids, ports

PORT="${SPARKEOS_S3_PORT:-29900}"
PYTHON="${SPARKEOS_S3_PYTHON:-$REPO/.venv/bin/python}"
START_TIMEOUT="${SPARKEOS_S3_START_TIMEOUT:-60}"
SDIR="$SERVICES_DIR/s3${SPARKEOS_S3_INSTANCE:+-$SPARKEOS_S3_INSTANCE}"
PIDFILE="$SDIR/s3.pid"
LOGFILE="$SDIR/s3.log"
MOTO_REQUIREMENT="moto[s3,server]>=5.1"

[[ "$PORT" =~ ^[0-9]+$ ]] || die "SPARKEOS_S3_PORT must be a number"
mkdir -p "$SDIR"

S3A_JARS="$SERVICES_DIR/s3a-jars"

hadoop_version() {
  if [[ -n "${SPARKEOS_HADOOP_VERSION:-}" ]]; then echo "$SPARKEOS_HADOOP_VERSION"; return; fi
  local jars
  jars="$("$PYTHON" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')" ||
    die "pyspark not found in $PYTHON (run ./run setup, or set SPARKEOS_HADOOP_VERSION)"
  local api=("$jars"/hadoop-client-api-*.jar)
  [[ -e "${api[0]}" ]] || die "no hadoop-client-api jar in $jars (set SPARKEOS_HADOOP_VERSION)"
  basename "${api[0]}" .jar | sed 's/^hadoop-client-api-//'
}

cmd_spark_jars() {
  local hadoop sdk accelerator="1.3.1" exclusions=""
  hadoop="$(hadoop_version)"
  case "$hadoop" in
    3.5.0) sdk="${SPARKEOS_S3A_SDK_VERSION:-2.35.4}" ;;
    *) sdk="${SPARKEOS_S3A_SDK_VERSION:-}"
       [[ -n "$sdk" ]] || die "Hadoop $hadoop: set SPARKEOS_S3A_SDK_VERSION to the AWS SDK v2 version its hadoop-aws names (mvn dependency:tree -Dartifact=org.apache.hadoop:hadoop-aws:$hadoop)" ;;
  esac
  local group
  for group in io.netty org.apache.httpcomponents commons-codec commons-logging org.slf4j; do
    exclusions+="<exclusion><groupId>$group</groupId><artifactId>*</artifactId></exclusion>"
  done
  fetch_jars "$S3A_JARS" "$SERVICES_DIR/s3a-pom" s3a-jars ".fetched-$hadoop-$sdk" \
    "Hadoop S3A $hadoop (AWS SDK $sdk)" <<EOF
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-aws</artifactId><version>$hadoop</version>
      <exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>s3</artifactId><version>$sdk</version>
      <exclusions>$exclusions</exclusions></dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>s3-transfer-manager</artifactId><version>$sdk</version>
      <exclusions>$exclusions</exclusions></dependency>
    <dependency><groupId>software.amazon.s3.analyticsaccelerator</groupId><artifactId>analyticsaccelerator-s3</artifactId><version>$accelerator</version></dependency>
EOF
  local jars=("$S3A_JARS"/*.jar)
  [[ -e "${jars[0]}" ]] || die "no jars in $S3A_JARS"
  (IFS=,; echo "${jars[*]}")
}

cmd_fetch() {
  [[ -x "$PYTHON" ]] || die "$PYTHON not found (run ./run setup first, or set SPARKEOS_S3_PYTHON)"
  if "$PYTHON" -c "import moto.server, werkzeug" 2>/dev/null; then return 0; fi
  log "installing $MOTO_REQUIREMENT into $("$PYTHON" -c 'import sys; print(sys.prefix)') ..."
  "$PYTHON" -m pip install -q "$MOTO_REQUIREMENT" >"$SDIR/pip.log" 2>&1 ||
    { tail -n 20 "$SDIR/pip.log" >&2; die "could not install moto (log: $SDIR/pip.log)"; }
}

pid_is_ours() { pid_cmdline_has "$1" "sparkeos.testing.s3server" "--port $PORT"; }

# an anonymous GET of the service root answers with an HTTP status (moto: 200 or 403)
answers() { curl -s -o /dev/null -m 5 -w '%{http_code}' "http://$HOST:$PORT/" | grep -q '^[1-5]'; }

cmd_start() {
  local args=(-m sparkeos.testing.s3server --host "$HOST" --port "$PORT")
  [[ "${SPARKEOS_S3_NO_CONDITIONAL:-}" != 1 ]] || args+=(--no-conditional-writes)
  http_service_start "S3 (moto)" "s3=http://$HOST:$PORT" SPARKEOS_S3_PORT "$REPO" \
    env PYTHONPATH="$REPO" "$PYTHON" "${args[@]}"
}

cmd_stop() { http_service_stop; }

cmd_status() { http_service_status "s3=http://$HOST:$PORT"; }

case "${1:-}" in
  fetch) cmd_fetch ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  spark-jars) cmd_spark_jars ;;
  *) echo "usage: $0 {fetch|start|stop|status|spark-jars}" >&2; exit 2 ;;
esac
