#!/usr/bin/env bash
# A Docker engine for the container tests, on a machine that may have none running.
#
#   docker/engine.sh start    install Debian's docker.io if dockerd is missing, start dockerd
#                             if no engine answers; prints `started-by-us=yes|no`
#   docker/engine.sh stop     stop the dockerd that `start` started (by its pid); an engine
#                             that was already running is left alone
#   docker/engine.sh status   exit 0 if an engine answers, 3 if not
#
# The dockerd started here logs to $SPARKEOS_SERVICES_DIR/docker/dockerd.log and keeps its
# pid in .../docker/dockerd.pid. Its data stays in /var/lib/docker (built images survive a
# stop, so a second run of docker/images/build.sh is fast).
set -euo pipefail
# shellcheck source=services/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/services/lib.sh"

STATE="$SERVICES_DIR/docker"
PIDFILE="$STATE/dockerd.pid"
LOGFILE="$STATE/dockerd.log"

engine_answers() { docker info >/dev/null 2>&1; }

is_our_dockerd() { pid_cmdline_has "$1" dockerd; }

start() {
  if engine_answers; then echo "started-by-us=no"; return 0; fi
  take_lock "$STATE"
  if engine_answers; then echo "started-by-us=no"; return 0; fi
  if ! command -v dockerd >/dev/null; then
    apt_install docker.io "$STATE/apt.log" "dockerd (Debian's docker.io)"
  fi
  command -v iptables >/dev/null || apt_install iptables "$STATE/apt.log" "iptables"
  local as_root=()
  [[ "$(id -u)" == 0 ]] || as_root=(sudo -n)
  log "starting dockerd (log: $LOGFILE)"
  mkdir -p "$STATE"
  spawn "$PIDFILE" "$LOGFILE" / "${as_root[@]}" dockerd
  local pid i
  pid="$(await_pid "$PIDFILE")"
  for ((i = 0; i < 600; i++)); do   # up to 60 s; it answers in about 1 s
    engine_answers && break
    pid_alive "$pid" || { tail -n 20 "$LOGFILE" >&2; die "dockerd exited (log: $LOGFILE)"; }
    sleep 0.1
  done
  engine_answers || { tail -n 20 "$LOGFILE" >&2; die "dockerd did not answer within 60 s"; }
  log "dockerd answers (pid $pid)"
  echo "started-by-us=yes"
}

case "${1:-}" in
  start) start ;;
  stop) take_lock "$STATE"; stop_pidfile "$PIDFILE" is_our_dockerd dockerd ;;
  status) if engine_answers; then echo "running"; else echo "stopped"; exit 3; fi ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
