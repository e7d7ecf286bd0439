#!/usr/bin/env bash
# A local Google Cloud Storage emulator for development and integration tests, as a local
# process: fake-gcs-server (github.com/fsouza/fake-gcs-server), built once from the Go
# module proxy with the machine's Go into .services/gcs/bin (about two minutes the first
# time), data in memory (a restart starts empty).
#
#   bash docker/services/gcs.sh fetch    # build the binary if missing
#   bash docker/services/gcs.sh start    # fetch, start, wait; prints "gcs=http://127.0.0.1:<port>"
#   bash docker/services/gcs.sh status   # exit 0 if running, 3 if not
#   bash docker/services/gcs.sh stop     # TERM by pid file, then KILL
#   bash docker/services/gcs.sh spark-jars  # jars for spark.jars: Google's Cloud Storage
#                                           # connector for Hadoop (one shaded jar, 37 MB)
#
# Clients reach it with STORAGE_EMULATOR_HOST=http://127.0.0.1:<port> and no credentials
# (it takes anonymous requests); buckets are made by their users. It honours
# ifGenerationMatch=0 on uploads (the conditional create sparkeos needs) and ignores it on
# copies (rewrite): sparkeos' probe finds that and streams a publish instead.
#
# Environment:
#   SPARKEOS_SERVICES_DIR        default <repo>/.services
#   SPARKEOS_GCS_PORT            default 29910
#   SPARKEOS_GCS_VERSION         the fake-gcs-server module version, default v1.56.1
#   SPARKEOS_GCS_START_TIMEOUT   seconds, default 60
#   SPARKEOS_GCS_CONNECTOR_VERSION  gcs-connector's version, default 3.1.3
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # REPO, SERVICES_DIR, HOST, log, die, ...

PORT="${SPARKEOS_GCS_PORT:-29910}"
VERSION="${SPARKEOS_GCS_VERSION:-v1.56.1}"
START_TIMEOUT="${SPARKEOS_GCS_START_TIMEOUT:-60}"
SDIR="$SERVICES_DIR/gcs"
BIN="$SDIR/bin/fake-gcs-server"
PIDFILE="$SDIR/gcs.pid"
LOGFILE="$SDIR/gcs.log"

[[ "$PORT" =~ ^[0-9]+$ ]] || die "SPARKEOS_GCS_PORT must be a number"
mkdir -p "$SDIR"

cmd_fetch() {
  [[ -x "$BIN" && -f "$SDIR/.built-$VERSION" ]] && return 0
  command -v go >/dev/null || die "Go is needed to build fake-gcs-server (Debian: apt-get install golang; or set STORAGE_EMULATOR_HOST to an emulator you run)"
  log "building fake-gcs-server $VERSION with $(go version | cut -d' ' -f3) (first time: about two minutes) ..."
  local t0; t0="$(now_ns)"
  # Its own module and build caches: nothing of the user's Go environment is touched.
  # Unoptimized, without symbols: a test emulator's speed does not matter, the build's
  # does (measured: 15% less CPU, the build runs beside the tests).
  if ! GOBIN="$SDIR/bin" GOPATH="$SDIR/gopath" GOCACHE="$SDIR/gocache" GOFLAGS=-modcacherw \
      go install -gcflags='all=-N -l' -ldflags='-s -w' \
      "github.com/fsouza/fake-gcs-server@$VERSION" >"$SDIR/build.log" 2>&1; then
    tail -n 20 "$SDIR/build.log" >&2; die "could not build fake-gcs-server (log: $SDIR/build.log)"
  fi
  rm -rf "$SDIR/gocache" "$SDIR/gopath"
  touch "$SDIR/.built-$VERSION"
  log "fake-gcs-server built, $(elapsed_since "$t0") s"
}

CONNECTOR_VERSION="${SPARKEOS_GCS_CONNECTOR_VERSION:-3.1.3}"
CONNECTOR_JARS="$SERVICES_DIR/gcs-jars"

cmd_spark_jars() {
  fetch_jars "$CONNECTOR_JARS" "$SERVICES_DIR/gcs-pom" gcs-jars ".fetched-$CONNECTOR_VERSION" \
    "Google Cloud Storage connector $CONNECTOR_VERSION" <<EOF
    <dependency><groupId>com.google.cloud.bigdataoss</groupId><artifactId>gcs-connector</artifactId>
      <version>$CONNECTOR_VERSION</version><classifier>shaded</classifier>
      <exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions></dependency>
EOF
  local jars=("$CONNECTOR_JARS"/*.jar)
  [[ -e "${jars[0]}" ]] || die "no jars in $CONNECTOR_JARS"
  (IFS=,; echo "${jars[*]}")
}

pid_is_ours() { pid_cmdline_has "$1" "fake-gcs-server" "-port $PORT"; }

answers() { curl -s -o /dev/null -m 5 -w '%{http_code}' "http://$HOST:$PORT/storage/v1/b" | grep -q '^2'; }

cmd_start() {
  http_service_start "GCS (fake-gcs-server)" "gcs=http://$HOST:$PORT" SPARKEOS_GCS_PORT \
    "$SDIR" "$BIN" -scheme http -host "$HOST" -port "$PORT" -backend memory \
    -public-host "$HOST:$PORT" -log-level warn
}

cmd_stop() { http_service_stop; }

cmd_status() { http_service_status "gcs=http://$HOST:$PORT"; }

case "${1:-}" in
  fetch) take_lock "$SDIR"; cmd_fetch ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  spark-jars) cmd_spark_jars ;;
  *) echo "usage: $0 {fetch|start|stop|status|spark-jars}" >&2; exit 2 ;;
esac
