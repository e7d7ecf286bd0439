#!/usr/bin/env bash
# A local Azure Blob Storage emulator for development and integration tests, as a local
# process: Azurite's blob service (npm package azurite), installed once with the
# machine's Node.js and npm into .services/azure (about a minute the first time), data in
# memory (a restart starts empty).
#
#   bash docker/services/azure.sh fetch    # npm install if missing
#   bash docker/services/azure.sh start    # fetch, start, wait; prints "azure=<connection string>"
#   bash docker/services/azure.sh status   # exit 0 if running, 3 if not
#   bash docker/services/azure.sh stop     # TERM by pid file, then KILL
#
# Clients reach it with AZURE_STORAGE_CONNECTION_STRING set to the printed connection
# string (Azurite's well-known development account devstoreaccount1 and its published
# key); sparkeos URIs name that account: abfs://<container>@devstoreaccount1.dfs.core.
# windows.net/path. Containers are made by their users. Azurite honours If-None-Match: *
# on Put Blob, Put Block List and Copy Blob. Its telemetry is off: with it on, a stopped
# Azurite kept trying to send it and did not exit until KILLed (30 s per stop).
#
# Environment:
#   SPARKEOS_SERVICES_DIR          default <repo>/.services
#   SPARKEOS_AZURE_PORT            default 29920
#   SPARKEOS_AZURITE_VERSION       default 3.37.0 (runs on Node.js 20; npm warns that
#                                  one dependency asks for 22)
#   SPARKEOS_AZURE_START_TIMEOUT   seconds, default 60
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # REPO, SERVICES_DIR, HOST, log, die, ...

PORT="${SPARKEOS_AZURE_PORT:-29920}"
VERSION="${SPARKEOS_AZURITE_VERSION:-3.37.0}"
START_TIMEOUT="${SPARKEOS_AZURE_START_TIMEOUT:-60}"
SDIR="$SERVICES_DIR/azure"
BIN="$SDIR/node_modules/.bin/azurite-blob"
PIDFILE="$SDIR/azure.pid"
LOGFILE="$SDIR/azure.log"
ACCOUNT=devstoreaccount1
# Azurite's published development key (the same in every installation; not a secret)
KEY="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

[[ "$PORT" =~ ^[0-9]+$ ]] || die "SPARKEOS_AZURE_PORT must be a number"
mkdir -p "$SDIR"

connection_string() {
  echo "DefaultEndpointsProtocol=http;AccountName=$ACCOUNT;AccountKey=$KEY;BlobEndpoint=http://$HOST:$PORT/$ACCOUNT;"
}

cmd_fetch() {
  [[ -x "$BIN" && -f "$SDIR/.installed-$VERSION" ]] && return 0
  command -v npm >/dev/null || die "Node.js and npm are needed for Azurite (Debian: apt-get install nodejs npm; or set AZURE_STORAGE_CONNECTION_STRING to an emulator you run)"
  log "installing azurite $VERSION with npm (first time: about a minute) ..."
  local t0; t0="$(now_ns)"
  if ! (cd "$SDIR" && npm install --no-audit --no-fund --no-save --loglevel=error \
      "azurite@$VERSION") >"$SDIR/npm.log" 2>&1; then
    tail -n 20 "$SDIR/npm.log" >&2; die "could not install azurite (log: $SDIR/npm.log)"
  fi
  touch "$SDIR/.installed-$VERSION"
  log "azurite installed, $(elapsed_since "$t0") s"
}

pid_is_ours() { pid_cmdline_has "$1" "azurite-blob" "--blobPort $PORT"; }

# an anonymous request answers with an HTTP status (Azurite: 400 or 403)
answers() { curl -s -o /dev/null -m 5 -w '%{http_code}' "http://$HOST:$PORT/$ACCOUNT?comp=list" | grep -q '^[1-5]'; }

cmd_start() {
  http_service_start "Azure Blob (Azurite)" "azure=$(connection_string)" SPARKEOS_AZURE_PORT \
    "$SDIR" "$BIN" --blobHost "$HOST" --blobPort "$PORT" --inMemoryPersistence \
    --skipApiVersionCheck --disableTelemetry --silent
}

cmd_stop() { http_service_stop; }

cmd_status() { http_service_status "azure=$(connection_string)"; }

case "${1:-}" in
  fetch) take_lock "$SDIR"; cmd_fetch ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: $0 {fetch|start|stop|status}" >&2; exit 2 ;;
esac
