#!/usr/bin/env bash
# A private PostgreSQL server for sparkeos' tests and benchmarks, as a local process.
#
#   docker/services/postgres.sh start    install (Debian package) if missing, initdb, start
#   docker/services/postgres.sh stop     fast shutdown (prepared transactions survive it)
#   docker/services/postgres.sh status   running or not (exit 0 / 3)
#   docker/services/postgres.sh dsn      print the DSN clients use
#
# The cluster is our own (initdb), independent of Debian's default cluster: data, log
# and unix socket live in $SPARKEOS_SERVICES_DIR/postgres (default <repo>/.services).
# It listens on 127.0.0.1 only, trusts loopback connections of the roles `sparkeos` and
# `postgres`, and has max_prepared_transactions > 0 so two-phase commit works.
#
# Environment:
#   SPARKEOS_SERVICES_DIR      where service state lives (default <repo>/.services)
#   SPARKEOS_PG_PORT           TCP port (default 25432)
#   SPARKEOS_PG_MAX_PREPARED   max_prepared_transactions (default 64: 2 x partitions x
#                              sinks of the tests with room to spare; 0 disables 2PC)
#   SPARKEOS_PG_VERSION        a PostgreSQL major version under /usr/lib/postgresql to
#                              use (default: the newest installed)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SERVICES_DIR=${SPARKEOS_SERVICES_DIR:-$REPO/.services}
PORT=${SPARKEOS_PG_PORT:-25432}
MAX_PREPARED=${SPARKEOS_PG_MAX_PREPARED:-64}
DB_USER=sparkeos
DB_NAME=sparkeos

say() { printf '[postgres.sh] %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

case "$PORT" in ''|*[!0-9]*) die "SPARKEOS_PG_PORT=$PORT is not a port number" ;; esac
case "$MAX_PREPARED" in ''|*[!0-9]*) die "SPARKEOS_PG_MAX_PREPARED=$MAX_PREPARED is not a number" ;; esac

is_root() { [ "$(id -u)" = 0 ]; }

as_root() {
  if is_root; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else die "need root to run: $* (run as root, or install sudo)"
  fi
}

# PostgreSQL refuses to run as root: when we are root, the server runs as `postgres`.
as_owner() {
  if ! is_root; then "$@"; return; fi
  if command -v runuser >/dev/null; then runuser -u postgres -- "$@"
  else su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
  fi
}

find_bindir() {
  local dir version=${SPARKEOS_PG_VERSION:-}
  if [ -n "$version" ]; then
    dir=/usr/lib/postgresql/$version/bin
    [ -x "$dir/initdb" ] && { echo "$dir"; return 0; }
    return 1
  fi
  # The newest installed major version that has the server binaries.
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5 -n -r); do
    if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ]; then
      echo "$dir"; return 0
    fi
  done
  # Not Debian's layout: binaries on PATH (e.g. a source build).
  if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
    dirname "$(command -v initdb)"; return 0
  fi
  return 1
}

ensure_installed() {
  BIN=$(find_bindir) && return 0
  say "PostgreSQL server binaries not found: installing the Debian package 'postgresql'"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
    postgresql >/dev/null
  BIN=$(find_bindir) || die "installed 'postgresql' but found no initdb under /usr/lib/postgresql"
}

# The server runs as `postgres` when we are root; it must be able to reach its folder.
# A repository under a private home (e.g. /root, mode 700) is not reachable, so the
# state then goes to a folder of its own under /var/tmp (same choice on every call).
resolve_dir() {
  PG_DIR=$SERVICES_DIR/postgres
  if is_root && id postgres >/dev/null 2>&1; then
    local probe=$PG_DIR
    while [ ! -e "$probe" ]; do probe=$(dirname "$probe"); done
    if ! as_owner test -x "$probe" 2>/dev/null; then
      local sum; sum=$(printf '%s' "$SERVICES_DIR" | cksum | cut -d' ' -f1)
      PG_DIR=/var/tmp/sparkeos-services-$sum/postgres
      if [ "${1:-}" = note ]; then
        say "the postgres user cannot reach $SERVICES_DIR; using $PG_DIR instead"
      fi
    fi
  fi
  DATA=$PG_DIR/data
  SOCKET_DIR=$PG_DIR/socket
  LOG=$PG_DIR/postgres.log
}

dsn() { echo "postgresql://$DB_USER@127.0.0.1:$PORT/$DB_NAME"; }

running() {
  [ -f "$DATA/postmaster.pid" ] || return 1
  if [ -n "${BIN:-}" ] && [ -x "$BIN/pg_ctl" ]; then
    as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1
  else
    kill -0 "$(head -n1 "$DATA/postmaster.pid")" 2>/dev/null
  fi
}

psql_admin() {
  as_owner "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCKET_DIR" -p "$PORT" -U postgres \
    -d postgres "$@"
}

write_config() {
  # Rewritten on every start so changed settings apply after a restart.
  cat >"$DATA/sparkeos.conf" <<EOF
# Written by docker/services/postgres.sh on every start; edit the script, not this file.
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$SOCKET_DIR'
max_prepared_transactions = $MAX_PREPARED
fsync = on
synchronous_commit = on
logging_collector = off
log_min_messages = warning
EOF
  cat >"$DATA/pg_hba.conf" <<EOF
# Written by docker/services/postgres.sh: a private test server on loopback.
local all postgres                trust
local all $DB_USER                trust
host  all $DB_USER  127.0.0.1/32  trust
host  all postgres  127.0.0.1/32  trust
EOF
  if is_root; then chown postgres: "$DATA/sparkeos.conf" "$DATA/pg_hba.conf"; fi
}

init_cluster() {
  mkdir -p "$PG_DIR"
  if is_root; then chown postgres: "$PG_DIR"; fi
  chmod 700 "$PG_DIR"
  as_owner mkdir -p "$SOCKET_DIR"
  if [ ! -f "$DATA/PG_VERSION" ]; then
    say "creating a private cluster in $DATA"
    as_owner "$BIN/initdb" -D "$DATA" -U postgres -E UTF8 --locale=C.UTF-8 \
      --auth-local=trust --auth-host=trust >"$PG_DIR/initdb.log" 2>&1 ||
      { cat "$PG_DIR/initdb.log" >&2; die "initdb failed (log above)"; }
    echo "include_if_exists = 'sparkeos.conf'" >>"$DATA/postgresql.conf"
  fi
}

create_role_and_db() {
  if [ -z "$(psql_admin -tAc "SELECT 1 FROM pg_roles WHERE rolname = '$DB_USER'")" ]; then
    psql_admin -c "CREATE ROLE $DB_USER LOGIN CREATEDB"
  fi
  if [ -z "$(psql_admin -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" ]; then
    psql_admin -c "CREATE DATABASE $DB_NAME OWNER $DB_USER"
  fi
}

start() {
  ensure_installed
  resolve_dir note
  mkdir -p "$(dirname "$PG_DIR")"
  exec 9>"$(dirname "$PG_DIR")/.postgres.lock"
  if command -v flock >/dev/null; then flock -w 120 9 || die "another start holds the lock"; fi
  if running; then
    say "already running (pid $(head -n1 "$DATA/postmaster.pid"), data $DATA)"
  else
    init_cluster
    write_config
    say "starting PostgreSQL ($("$BIN/postgres" --version | awk '{print $3}')) on 127.0.0.1:$PORT"
    # 9>&-: the server must not inherit (and hold forever) the lock of this script.
    if ! as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null 9>&-; then
      tail -n 20 "$LOG" >&2 || true
      die "PostgreSQL did not start (log: $LOG; is port $PORT already taken?)"
    fi
  fi
  create_role_and_db
  echo "dsn=$(dsn)"
}

stop() {
  BIN=$(find_bindir) || BIN=
  resolve_dir
  if ! running; then say "not running"; return 0; fi
  if [ -n "$BIN" ]; then
    as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null
  else
    # No pg_ctl: stop the postmaster named by its own PID file (never by process name).
    local pid; pid=$(head -n1 "$DATA/postmaster.pid")
    kill -INT "$pid"
    for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  say "stopped"
}

status() {
  BIN=$(find_bindir) || BIN=
  resolve_dir
  if running; then
    echo "running pid=$(head -n1 "$DATA/postmaster.pid") data=$DATA dsn=$(dsn)"
  else
    echo "stopped data=$DATA"
    return 3
  fi
}

cmd=${1:-}
case "$cmd" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  dsn) dsn ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
