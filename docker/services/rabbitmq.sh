#!/usr/bin/env bash
# A real RabbitMQ broker with the STOMP plugin as a local process, for development and
# integration tests. No Docker. Uses Debian's `rabbitmq-server` package (3.10), whose
# system service this script never touches: it runs a private node of its own.
#
#   bash docker/services/rabbitmq.sh fetch    # apt-get install rabbitmq-server if missing
#   bash docker/services/rabbitmq.sh start    # fetch if needed, write the config, start, wait
#   bash docker/services/rabbitmq.sh status   # exit 0 if running, 3 if not
#   bash docker/services/rabbitmq.sh stop     # TERM by pid file, then KILL (node, then its epmd)
#   bash docker/services/rabbitmq.sh queue-stat QUEUE
#                                             # "name=QUEUE messages=3 messages_ready=3
#                                             #  messages_unacknowledged=0 consumers=0";
#                                             # exit 4 if there is no such queue
#   bash docker/services/rabbitmq.sh ctl ARGS # rabbitmqctl against the private node
#
# start prints "stomp=127.0.0.1:<port>" and "vhost=/" on stdout.
# Everything lives in .services/rabbitmq: rabbitmq.conf, enabled_plugins ([rabbitmq_stomp]),
# mnesia/ (the node's data), the Erlang cookie ($HOME is that directory), rabbitmq.log.
# Node sparkeos@localhost; STOMP on 127.0.0.1 only; no AMQP listener (listeners.tcp = none);
# Erlang distribution on 127.0.0.1:$SPARKEOS_RABBITMQ_DIST_PORT, registered with a PRIVATE
# epmd on 127.0.0.1:$SPARKEOS_RABBITMQ_EPMD_PORT that this script starts and stops by its pid
# (the shared epmd on 4369 is never used). User admin / admin (created at the first boot;
# loopback_users = none), vhost "/": STOMP CONNECT must send host:/ .
#
# Environment:
#   SPARKEOS_SERVICES_DIR             default <repo>/.services
#   SPARKEOS_RABBITMQ_PORT            STOMP port, default 39615
#   SPARKEOS_RABBITMQ_DIST_PORT       Erlang distribution port, default 39618
#   SPARKEOS_RABBITMQ_EPMD_PORT       the private epmd's port, default 39617
#   SPARKEOS_RABBITMQ_START_TIMEOUT   seconds, default 90
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$SCRIPT_DIR/../.." && pwd)"
SERVICES_DIR="${SPARKEOS_SERVICES_DIR:-$REPO/.services}"
PORT="${SPARKEOS_RABBITMQ_PORT:-39615}"
DIST_PORT="${SPARKEOS_RABBITMQ_DIST_PORT:-39618}"
EPMD_PORT="${SPARKEOS_RABBITMQ_EPMD_PORT:-39617}"
START_TIMEOUT="${SPARKEOS_RABBITMQ_START_TIMEOUT:-90}"
USER_NAME=admin
PASSWORD=admin
VHOST=/
NODENAME=sparkeos@localhost

RMQ_BIN=/usr/lib/rabbitmq/bin
RDIR="$SERVICES_DIR/rabbitmq"
MNESIA="$RDIR/mnesia"
PIDFILE="$RDIR/rabbitmq.pid"
EPMD_PIDFILE="$RDIR/epmd.pid"
LOGFILE="$RDIR/rabbitmq.log"
HOST=127.0.0.1

log() { echo "rabbitmq.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# start and stop of one instance are serialized (two pytest sessions may start the same
# broker at once). fd 9 holds the lock; the broker is started with 9>&- so it does not
# inherit it.
take_lock() {
  mkdir -p "$1"
  exec 9>>"$1/.lock"
  flock -w 600 9 || die "could not lock $1/.lock within 600 s"
}

for p in "$PORT" "$DIST_PORT" "$EPMD_PORT"; do [[ "$p" =~ ^[0-9]+$ ]] || die "ports must be numbers"; done

# The environment of every rabbitmq command (server and CLI) for the private node;
# nothing from /etc/rabbitmq is read.
rmq_env() {
  export HOME="$RDIR"    # the Erlang cookie: $RDIR/.erlang.cookie
  export RABBITMQ_NODENAME="$NODENAME"
  export RABBITMQ_CONF_ENV_FILE="$RDIR/rabbitmq-env.conf"
  export RABBITMQ_CONFIG_FILE="$RDIR/rabbitmq.conf"
  export RABBITMQ_ADVANCED_CONFIG_FILE="$RDIR/advanced.config"
  export RABBITMQ_ENABLED_PLUGINS_FILE="$RDIR/enabled_plugins"
  export RABBITMQ_MNESIA_BASE="$MNESIA"
  export RABBITMQ_LOG_BASE="$RDIR/log"
  export RABBITMQ_LOGS=-   # to stdout, i.e. $LOGFILE
  export RABBITMQ_PID_FILE="$RDIR/rabbit-node.pid"
  export RABBITMQ_DIST_PORT="$DIST_PORT"
  export ERL_EPMD_PORT="$EPMD_PORT"
  export ERL_EPMD_ADDRESS="$HOST"
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

# ---------------------------------------------------------------- fetch

cmd_fetch() {
  if [[ -x "$RMQ_BIN/rabbitmq-server" ]] && compgen -G "/usr/lib/rabbitmq/lib/*/plugins/rabbitmq_stomp-*" >/dev/null; then
    return 0
  fi
  local sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || die "rabbitmq-server is missing and there is no sudo: apt-get install rabbitmq-server"
    sudo=(sudo -n)
  fi
  log "installing Debian's rabbitmq-server package ..."
  local t0=$SECONDS
  mkdir -p "$SERVICES_DIR"
  # its postinst would start the system service; policy-rc.d usually refuses (containers)
  if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends rabbitmq-server \
      >"$SERVICES_DIR/apt-rabbitmq.log" 2>&1; then
    "${sudo[@]}" apt-get update -q >>"$SERVICES_DIR/apt-rabbitmq.log" 2>&1 || true
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends rabbitmq-server \
      >>"$SERVICES_DIR/apt-rabbitmq.log" 2>&1 \
      || { tail -n 20 "$SERVICES_DIR/apt-rabbitmq.log" >&2; die "apt-get install rabbitmq-server failed (log: $SERVICES_DIR/apt-rabbitmq.log)"; }
  fi
  [[ -x "$RMQ_BIN/rabbitmq-server" ]] || die "rabbitmq-server installed but $RMQ_BIN/rabbitmq-server is missing"
  log "rabbitmq-server $(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null || echo '?') installed ($((SECONDS - t0)) s)"
}

# ---------------------------------------------------------------- config

write_config() {
  mkdir -p "$RDIR" "$MNESIA" "$RDIR/log"
  : >"$RDIR/rabbitmq-env.conf"
  echo '[rabbitmq_stomp].' >"$RDIR/enabled_plugins"
  cat >"$RDIR/rabbitmq.conf" <<EOF
# generated by docker/services/rabbitmq.sh (regenerated on every start)
listeners.tcp = none
loopback_users = none
default_user = $USER_NAME
default_pass = $PASSWORD
default_vhost = $VHOST
default_permissions.configure = .*
default_permissions.read = .*
default_permissions.write = .*
stomp.listeners.tcp.1 = $HOST:$PORT
stomp.default_vhost = $VHOST
log.console = true
log.console.level = info
log.file = false
EOF
}

# ---------------------------------------------------------------- process

read_pid() { [[ -f "$1" ]] && tr -dc '0-9' <"$1" || true; }

# alive AND really our node (guards against a recycled pid): its environment names our data
pid_is_ours() {
  local pid="$1"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qxF "RABBITMQ_MNESIA_BASE=$MNESIA"
}

epmd_is_ours() {
  local pid="$1"
  [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "epmd -port $EPMD_PORT "
}

port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# a STOMP 1.2 CONNECT with the credentials answers CONNECTED (host: is the vhost)
stomp_answers() {
  timeout 10 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "CONNECT\naccept-version:1.2\nhost:%s\nlogin:%s\npasscode:%s\nheart-beat:0,0\n\n\0" "$4" "$2" "$3" >&3
    IFS= read -r -t 8 line <&3 || exit 1
    line="${line%$'"'"'\r'"'"'}"
    [[ "$line" == CONNECTED ]] || exit 1
    # a clean goodbye: DISCONNECT with a receipt, then read until the broker closes
    printf "DISCONNECT\nreceipt:bye\n\n\0" >&3
    while IFS= read -r -t 3 -d "" _ <&3; do :; done
  ' "$HOST" "$PORT" "$USER_NAME" "$PASSWORD" "$VHOST" 2>/dev/null
}

start_epmd() {
  local pid; pid="$(read_pid "$EPMD_PIDFILE")"
  if epmd_is_ours "$pid"; then return 0; fi
  rm -f "$EPMD_PIDFILE"
  if port_open "$EPMD_PORT"; then
    die "port $EPMD_PORT (private epmd) already in use by another process (set SPARKEOS_RABBITMQ_EPMD_PORT)"
  fi
  command -v epmd >/dev/null || die "epmd not found (apt-get install erlang-base)"
  # foreground epmd (no -daemon), so the pid file names it
  setsid bash -c 'echo $$ >"$0"; exec epmd -port "$1" -address "$2"' "$EPMD_PIDFILE" "$EPMD_PORT" "$HOST" \
    </dev/null >>"$RDIR/epmd.log" 2>&1 9>&- &
  local i
  for ((i = 0; i < 100; i++)); do
    pid="$(read_pid "$EPMD_PIDFILE")"
    if [[ -n "$pid" ]] && epmd -port "$EPMD_PORT" -names >/dev/null 2>&1; then return 0; fi
    sleep 0.05
  done
  die "the private epmd did not start on $HOST:$EPMD_PORT (log: $RDIR/epmd.log)"
}

stop_pid() { # $1 = pid, $2 = name
  local pid="$1" i
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do   # 30 s for a clean shutdown
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$2 (pid $pid) did not stop after TERM; sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
}

wait_ready() { # $1 = pid; returns when the broker answers, dies on exit or timeout
  local pid="$1" deadline=$((SECONDS + START_TIMEOUT))
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 40 "$LOGFILE" >&2
      rm -f "$PIDFILE"
      die "RabbitMQ (pid $pid) exited during start (log: $LOGFILE)"
    fi
    if port_open "$PORT" && stomp_answers; then return 0; fi
    if ((SECONDS >= deadline)); then
      tail -n 40 "$LOGFILE" >&2
      die "RabbitMQ did not answer STOMP on $HOST:$PORT within $START_TIMEOUT s (pid $pid; log: $LOGFILE; stop it with: $0 stop)"
    fi
    sleep 0.25
  done
}

print_urls() {
  echo "stomp=$HOST:$PORT"
  echo "vhost=$VHOST"
}

cmd_start() {
  take_lock "$RDIR"
  local pid; pid="$(read_pid "$PIDFILE")"
  if pid_is_ours "$pid"; then   # already running (or still starting): just wait for it
    wait_ready "$pid"
    print_urls
    return 0
  fi
  rm -f "$PIDFILE"
  if port_open "$PORT" || port_open "$DIST_PORT"; then
    die "port $PORT or $DIST_PORT already in use by another process (set SPARKEOS_RABBITMQ_PORT / SPARKEOS_RABBITMQ_DIST_PORT)"
  fi
  cmd_fetch
  write_config
  rmq_env
  local t0; t0=$(date +%s%N)
  start_epmd
  echo "==== $(date -Is) starting RabbitMQ node $NODENAME, STOMP on $HOST:$PORT" >>"$LOGFILE"
  # The child writes its own pid and execs rabbitmq-server, which (with "detached" set)
  # execs erl, which execs beam.smp: the pid file names the Erlang VM. setsid: its own
  # session, so it outlives the caller's process group.
  detached=true setsid bash -c 'cd "$1" || exit 1; echo $$ >"$0"; exec "$2"' \
    "$PIDFILE" "$RDIR" "$RMQ_BIN/rabbitmq-server" </dev/null >>"$LOGFILE" 2>&1 9>&- &
  local i
  for ((i = 0; i < 100; i++)); do pid="$(read_pid "$PIDFILE")"; [[ -n "$pid" ]] && break; sleep 0.05; done
  [[ -n "$pid" ]] || die "RabbitMQ process did not start (log: $LOGFILE)"
  wait_ready "$pid"
  local ms=$((($(date +%s%N) - t0) / 1000000))
  log "RabbitMQ up, pid $pid, $((ms / 1000)).$((ms % 1000 / 100)) s"
  print_urls
}

cmd_stop() {
  take_lock "$RDIR"
  local pid; pid="$(read_pid "$PIDFILE")"
  if [[ -z "$pid" ]]; then
    log "not running (no pid file)"
  elif ! pid_is_ours "$pid"; then
    log "not running (stale pid file, pid $pid)"
  else
    stop_pid "$pid" RabbitMQ
    log "stopped (pid $pid)"
  fi
  rm -f "$PIDFILE"
  pid="$(read_pid "$EPMD_PIDFILE")"
  if epmd_is_ours "$pid"; then
    stop_pid "$pid" epmd
    log "stopped the private epmd (pid $pid)"
  fi
  rm -f "$EPMD_PIDFILE"
}

cmd_status() {
  local pid; pid="$(read_pid "$PIDFILE")"
  if pid_is_ours "$pid"; then
    local rss; rss="$(awk '/VmRSS/{print $2 " " $3}' "/proc/$pid/status" 2>/dev/null || echo '?')"
    if stomp_answers; then
      echo "running pid=$pid rss=$rss stomp=$HOST:$PORT node=$NODENAME"
      return 0
    fi
    echo "starting-or-unresponsive pid=$pid stomp=$HOST:$PORT"
    return 1
  fi
  echo "stopped"
  return 3
}

cmd_ctl() {
  rmq_env
  exec "$RMQ_BIN/rabbitmqctl" -n "$NODENAME" "$@"
}

# One line for exactly the queue $1 of vhost "/", from rabbitmqctl list_queues:
#   name=q messages=3 messages_ready=3 messages_unacknowledged=0 consumers=0
# messages = ready + unacknowledged; exit 4 if there is no such queue.
cmd_queue_stat() {
  local queue="${1:-}"
  [[ -n "$queue" ]] || die "usage: $0 queue-stat QUEUE"
  rmq_env
  local out
  if ! out="$("$RMQ_BIN/rabbitmqctl" -n "$NODENAME" -q list_queues -p "$VHOST" --no-table-headers \
      name messages messages_ready messages_unacknowledged consumers 2>&1)"; then
    printf '%s\n' "$out" >&2
    die "rabbitmqctl list_queues failed"
  fi
  QUEUE="$queue" awk -F'\t' '
    $1 == ENVIRON["QUEUE"] {
      printf "name=%s messages=%s messages_ready=%s messages_unacknowledged=%s consumers=%s\n", $1, $2, $3, $4, $5
      found = 1
    }
    END { exit(found ? 0 : 4) }' <<<"$out"
}

case "${1:-}" in
  fetch) cmd_fetch ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  queue-stat) shift; cmd_queue_stat "$@" ;;
  ctl) shift; cmd_ctl "$@" ;;
  *) echo "usage: $0 {fetch|start|stop|status|queue-stat QUEUE|ctl ARGS...}" >&2; exit 2 ;;
esac
