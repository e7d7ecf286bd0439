#!/usr/bin/env bash
# Entrypoint of sparkeos/postgres: the part of the upstream postgres image's interface that
# docker/compose.yaml and the tests rely on, written anew for Debian's packages.
#
#   docker run -e POSTGRES_PASSWORD=... sparkeos/postgres:17 [postgres -c name=value ...]
#
# Environment (as upstream):
#   POSTGRES_PASSWORD          required unless POSTGRES_HOST_AUTH_METHOD=trust
#   POSTGRES_USER              superuser created by initdb, default postgres
#   POSTGRES_DB                database created at initialization, default $POSTGRES_USER
#   POSTGRES_INITDB_ARGS       extra initdb arguments (word-split), e.g. "--data-checksums"
#   POSTGRES_HOST_AUTH_METHOD  pg_hba method for TCP from any host, default scram-sha-256
#   POSTGRES_*_FILE            read the variable from a file (docker secrets)
#   PGDATA                     default /var/lib/postgresql/data (a volume)
#
# Initialization (initdb, the database, /docker-entrypoint-initdb.d/*.sh|*.sql|*.sql.gz)
# runs only when $PGDATA has no PG_VERSION: a stopped and restarted container keeps its data,
# prepared transactions included. During it the server listens on the Unix socket only, so a
# `pg_isready -h 127.0.0.1` health check cannot pass early.
set -Eeuo pipefail

# "docker run IMAGE -c x=y" means "postgres -c x=y" (as upstream)
if [[ "${1:-}" == -* ]]; then set -- postgres "$@"; fi
# anything else (bash, psql, pg_dump ...) just runs
if [[ "${1:-}" != postgres ]]; then exec "$@"; fi
# so do the options that only print something (postgres --version, -C name, ...), as upstream
for arg in "${@:2}"; do
  case "$arg" in -'?'|--help|--describe-config|-V|--version|-C|-C*) exec "$@" ;; esac
done

export PGDATA="${PGDATA:-/var/lib/postgresql/data}"

log() { echo "docker-entrypoint.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# file_env VAR [DEFAULT]: VAR from the environment, or from the file named by VAR_FILE
file_env() {
  local var="$1" fvar="${1}_FILE" def="${2:-}" val
  if [[ -n "${!var:-}" && -n "${!fvar:-}" ]]; then die "both $var and $fvar are set (they are exclusive)"; fi
  val="$def"
  if [[ -n "${!var:-}" ]]; then val="${!var}"
  elif [[ -n "${!fvar:-}" ]]; then val="$(<"${!fvar}")"; fi
  export "$var"="$val"
  unset "$fvar"
}

# as root: make the directories ours, then run this script again as postgres (the server
# refuses to run as root). setpriv comes with util-linux, which every Debian system has.
if [[ "$(id -u)" == 0 ]]; then
  mkdir -p "$PGDATA" /var/run/postgresql
  chmod 00700 "$PGDATA" || :
  # only what is not ours yet: a large existing data directory stays untouched
  find "$PGDATA" \! -user postgres -exec chown postgres:postgres '{}' +
  chown postgres:postgres /var/run/postgresql
  chmod 03775 /var/run/postgresql || :
  exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi

# ---------------------------------------------------------------- first start: initdb

temp_server_start() { # the server as the user runs it (its -c options too), socket only
  local args=("${@:2}" -c "listen_addresses=" -p "${PGPORT:-5432}")
  PGUSER="$POSTGRES_USER" pg_ctl -D "$PGDATA" -o "$(printf '%q ' "${args[@]}")" -w start >&2
}

temp_server_stop() { PGUSER="$POSTGRES_USER" pg_ctl -D "$PGDATA" -m fast -w stop >&2; }

# psql as the superuser over the socket (local connections are trusted during init)
psql_init() {
  psql -v ON_ERROR_STOP=1 --no-psqlrc --no-password --username "$POSTGRES_USER" "$@"
}

run_init_scripts() {
  local f
  for f in /docker-entrypoint-initdb.d/*; do
    [[ -e "$f" ]] || continue
    case "$f" in
      *.sh)
        if [[ -x "$f" ]]; then log "running $f"; "$f"
        else log "sourcing $f"; # shellcheck disable=SC1090
          . "$f"; fi ;;
      *.sql) log "running $f"; psql_init --dbname "$POSTGRES_DB" -f "$f" ;;
      *.sql.gz) log "running $f"; gunzip -c "$f" | psql_init --dbname "$POSTGRES_DB" ;;
      *) log "ignoring $f" ;;
    esac
  done
}

initialize() {
  file_env POSTGRES_PASSWORD
  file_env POSTGRES_USER postgres
  file_env POSTGRES_DB "$POSTGRES_USER"
  file_env POSTGRES_INITDB_ARGS
  local auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
  if [[ -z "$POSTGRES_PASSWORD" && "$auth" != trust ]]; then
    die "the database is uninitialized and POSTGRES_PASSWORD is not set
  (set POSTGRES_PASSWORD, or POSTGRES_HOST_AUTH_METHOD=trust to allow connections without one)"
  fi

  log "initializing $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
  local initdb_args=()
  read -r -a initdb_args <<<"$POSTGRES_INITDB_ARGS" || true
  # the password through a pipe: it never shows in a process listing
  initdb --username="$POSTGRES_USER" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
    --encoding=UTF8 "${initdb_args[@]}" >&2
  # TCP from anywhere with a password (the socket keeps initdb's local "trust" lines)
  printf '\n# added by docker-entrypoint.sh\nhost all all all %s\n' "$auth" >>"$PGDATA/pg_hba.conf"

  temp_server_start "$@"
  if [[ "$POSTGRES_DB" != postgres ]]; then
    local exists
    # psql -c does not interpolate variables: the statements come on stdin instead
    exists="$(psql_init --dbname postgres -tA -v db="$POSTGRES_DB" \
      <<<"SELECT 1 FROM pg_database WHERE datname = :'db'")"
    if [[ -z "$exists" ]]; then
      psql_init --dbname postgres -v db="$POSTGRES_DB" <<<'CREATE DATABASE :"db";' >&2
    fi
  fi
  run_init_scripts
  temp_server_stop
  log "initialization done"
}

if [[ ! -s "$PGDATA/PG_VERSION" ]]; then
  initialize "$@"
else
  log "$PGDATA holds a database already: skipping initialization"
fi

exec "$@"
