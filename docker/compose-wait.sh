#!/usr/bin/env bash
# Waits until every container of the docker/compose.yaml project is healthy: what
# `docker compose up -d --wait` does in Compose v2, for Debian's docker-compose 1.29, which
# has no --wait.
#
#   docker-compose -f docker/compose.yaml up -d && bash docker/compose-wait.sh
#   bash docker/compose-wait.sh [-f COMPOSE_FILE] [-p PROJECT] [-t TIMEOUT_SECONDS]
#   bash docker/compose-wait.sh --help
#
# Defaults: -f docker/compose.yaml (next to this script), the project compose derives itself
# (COMPOSE_PROJECT_NAME is honoured, as by compose), -t $SPARKEOS_COMPOSE_WAIT_TIMEOUT or 180.
# Uses `docker compose` (v2) when present, else `docker-compose`.
#
# Exit 0 when all are healthy (a container without a health check counts once it runs).
# Exit 1, naming the service, with its health check's last output and the end of its log,
# when a container exits, turns unhealthy, or is not healthy within the timeout; or when
# the project has no containers (not started).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
FILE="$HERE/compose.yaml"
PROJECT=()
TIMEOUT="${SPARKEOS_COMPOSE_WAIT_TIMEOUT:-180}"

log() { echo "compose-wait.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    -f|--file) FILE="${2:?-f needs a file}"; shift 2 ;;
    -p|--project-name) PROJECT=(-p "${2:?-p needs a name}"); shift 2 ;;
    -t|--timeout) TIMEOUT="${2:?-t needs seconds}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "the timeout must be a number of seconds, not: $TIMEOUT"

if docker compose version >/dev/null 2>&1; then
  COMPOSE=(docker compose)
elif command -v docker-compose >/dev/null; then
  COMPOSE=(docker-compose)
else
  die "neither 'docker compose' (v2) nor 'docker-compose' (v1) is installed"
fi
COMPOSE+=(-f "$FILE" "${PROJECT[@]}")

# the containers of the project (created ones too: a container that failed to start counts)
mapfile -t IDS < <("${COMPOSE[@]}" ps -q 2>/dev/null | sed '/^$/d')
[[ ${#IDS[@]} -gt 0 ]] || die "no containers for $FILE (start them first: ${COMPOSE[*]} up -d)"

# state ID: "SERVICE STATUS HEALTH" (HEALTH "none" without a health check)
state() {
  docker inspect -f '{{index .Config.Labels "com.docker.compose.service"}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$1"
}

# explain ID SERVICE WHY: dies with what is known about the container
explain() {
  local id="$1" service="$2" why="$3" output
  # the last health check's output (docker keeps the last five)
  output="$(docker inspect -f '{{if .State.Health}}{{range .State.Health.Log}}{{printf "--- exit %d at %s\n%s\n" .ExitCode .End .Output}}{{end}}{{end}}' "$id" \
    | awk '/^--- exit /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}')"
  log "service $service: $why"
  if [[ -n "$output" ]]; then
    log "its last health check:"
    sed 's/^/    /' <<<"$output" >&2
  fi
  log "the end of its log (docker logs --tail 30 $id):"
  docker logs --tail 30 "$id" 2>&1 | sed 's/^/    /' >&2
  die "service $service is not healthy ($why)"
}

t0=$SECONDS
deadline=$((SECONDS + TIMEOUT))
while :; do
  pending=()
  for id in "${IDS[@]}"; do
    read -r service status health < <(state "$id") || die "container $id is gone"
    case "$status/$health" in
      running/healthy|running/none) ;;
      running/unhealthy) explain "$id" "$service" "unhealthy" ;;
      exited/*|dead/*) explain "$id" "$service" "the container $status (exit code $(docker inspect -f '{{.State.ExitCode}}' "$id"))" ;;
      *) pending+=("$service:$status/$health") ;;
    esac
  done
  if [[ ${#pending[@]} -eq 0 ]]; then
    log "all healthy after $((SECONDS - t0)) s: $(for id in "${IDS[@]}"; do state "$id" | cut -d' ' -f1; done | sort | tr '\n' ' ')"
    exit 0
  fi
  if ((SECONDS >= deadline)); then
    first="${pending[0]%%:*}"
    for id in "${IDS[@]}"; do
      if [[ "$(state "$id" | cut -d' ' -f1)" == "$first" ]]; then
        log "not healthy within $TIMEOUT s: ${pending[*]}"
        explain "$id" "$first" "not healthy within $TIMEOUT s"
      fi
    done
  fi
  sleep 1
done
