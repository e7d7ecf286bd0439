# shellcheck shell=bash
# Helpers shared by the broker scripts of docker/services (kafka.sh, artemis.sh,
# activemq.sh, rabbitmq.sh), which source this file after `set -euo pipefail`:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
#
# It sets REPO (the checkout), SERVICES_DIR ($SPARKEOS_SERVICES_DIR, default <repo>/.services)
# and HOST (127.0.0.1: every broker listens on loopback only). The functions take what they
# work on (pid file, log file, port, ...) as arguments; messages go to stderr as
# "<script>: ...", e.g. "kafka.sh: stopped (pid 123)".

SCRIPT_NAME="$(basename "${BASH_SOURCE[1]:-$0}")"   # the script that sources this file
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck disable=SC2034  # used by the scripts that source this file
SERVICES_DIR="${SPARKEOS_SERVICES_DIR:-$REPO/.services}"
HOST=127.0.0.1

log() { echo "$SCRIPT_NAME: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# take_lock DIR: serializes start and stop of one instance (two pytest sessions may start
# the same broker at once): an flock on DIR/.lock, held by fd 9 until the script exits.
# spawn starts the broker with 9>&-, so it does not inherit the lock.
take_lock() {
  mkdir -p "$1"
  exec 9>>"$1/.lock"
  flock -w 600 9 || die "could not lock $1/.lock within 600 s"
}

# apt_install PACKAGE LOGFILE WHAT: apt-get install PACKAGE (as root, or with sudo -n), once
# more after an apt-get update if that fails; output to LOGFILE. WHAT names what is missing
# in the message when there is neither root nor sudo.
apt_install() {
  local package="$1" logfile="$2" what="$3" sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || die "$what is missing and there is no sudo: apt-get install $package"
    sudo=(sudo -n)
  fi
  log "installing Debian's $package package ..."
  mkdir -p "$(dirname "$logfile")"
  if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$package" \
      >"$logfile" 2>&1; then
    "${sudo[@]}" apt-get update -q >>"$logfile" 2>&1 || true
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$package" \
      >>"$logfile" 2>&1 \
      || { tail -n 20 "$logfile" >&2; die "apt-get install $package failed (log: $logfile)"; }
  fi
}

# ---------------------------------------------------------------- pids

# read_pid PIDFILE: the pid it holds, empty if there is none
read_pid() { [[ -f "$1" ]] && tr -dc '0-9' <"$1" || true; }

# pid_alive PID: PID is not empty and names a live process
pid_alive() { [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; }

# pid_cmdline_has PID TEXT...: PID is alive and its command line (the arguments joined by
# spaces, with a trailing space) contains every TEXT. "Is this pid still our process": it
# guards against a recycled pid.
pid_cmdline_has() {
  local pid="$1" cmdline text
  shift
  pid_alive "$pid" || return 1
  cmdline="$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" || return 1
  for text in "$@"; do
    [[ "$cmdline" == *"$text"* ]] || return 1
  done
}

# pid_environ_has PID NAME=VALUE: PID is alive and has exactly that variable in its environment
pid_environ_has() {
  pid_alive "$1" || return 1
  tr '\0' '\n' 2>/dev/null <"/proc/$1/environ" | grep -xF -- "$2" >/dev/null
}

# our_pid PIDFILE IS_OURS: prints the pid of PIDFILE if the command IS_OURS PID succeeds,
# else fails
our_pid() {
  local pid; pid="$(read_pid "$1")"
  "$2" "$pid" || return 1
  echo "$pid"
}

# spawn PIDFILE LOGFILE DIR COMMAND [ARG...]: starts COMMAND in the background in DIR, in a
# session of its own (setsid: it outlives the caller's process group), with stdin /dev/null,
# stdout and stderr appended to LOGFILE, and without fd 9 (take_lock's lock). The child
# writes its own pid to PIDFILE and then execs COMMAND, so PIDFILE names COMMAND's process
# (and what COMMAND execs in turn, e.g. a JVM). It does not wait: see await_pid.
spawn() {
  local pidfile="$1" logfile="$2" dir="$3"
  shift 3
  setsid bash -c 'cd "$1" || exit 1; echo $$ >"$0"; shift; exec "$@"' "$pidfile" "$dir" "$@" \
    </dev/null >>"$logfile" 2>&1 9>&- &
}

# await_pid PIDFILE: prints the pid spawn's child writes to PIDFILE, waiting up to 5 s for
# it; prints nothing if it does not come
await_pid() {
  local pid="" i
  for ((i = 0; i < 100; i++)); do pid="$(read_pid "$1")"; [[ -n "$pid" ]] && break; sleep 0.05; done
  echo "$pid"
}

# stop_pid PID [NAME]: TERM, up to 30 s for a clean shutdown, then KILL (and up to 5 s more)
stop_pid() {
  local pid="$1" who="pid $1" i
  [[ -z "${2:-}" ]] || who="$2 (pid $1)"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do   # 30 s for a clean shutdown
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "$who did not stop after TERM; sending KILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
}

# stop_pidfile PIDFILE IS_OURS [NAME]: the `stop` command. Stops the process PIDFILE names
# (stop_pid) if IS_OURS PID says it is ours and removes PIDFILE; a stale PIDFILE (a dead or
# recycled pid) is removed, a missing one is fine.
stop_pidfile() {
  local pidfile="$1" is_ours="$2" pid
  pid="$(read_pid "$pidfile")"
  if [[ -z "$pid" ]]; then log "not running (no pid file)"; return 0; fi
  if ! "$is_ours" "$pid"; then
    log "not running (stale pid file, pid $pid)"; rm -f "$pidfile"; return 0
  fi
  stop_pid "$pid" "${3:-}"
  rm -f "$pidfile"
  log "stopped (pid $pid)"
}

# service_status PIDFILE IS_OURS RUNNING_INFO STARTING_INFO CHECK [ARG...]: the `status`
# command. Prints one line and returns
#   0  "running pid=P rss=R RUNNING_INFO"               P is ours and CHECK ARG... succeeds
#   1  "starting-or-unresponsive pid=P STARTING_INFO"   P is ours, CHECK fails
#   3  "stopped"                                        no process of ours
service_status() {
  local pidfile="$1" is_ours="$2" running="$3" starting="$4" pid rss
  shift 4
  if pid="$(our_pid "$pidfile" "$is_ours")"; then
    rss="$(awk '/VmRSS/{print $2 " " $3}' "/proc/$pid/status" 2>/dev/null || echo '?')"
    if "$@"; then
      echo "running pid=$pid rss=$rss $running"
      return 0
    fi
    echo "starting-or-unresponsive pid=$pid $starting"
    return 1
  fi
  echo "stopped"
  return 3
}

# ---------------------------------------------------------------- readiness

# port_open PORT: something accepts TCP connections on $HOST:PORT
port_open() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# ports_free PORT...: none of the ports accepts connections on $HOST
ports_free() {
  local port
  for port in "$@"; do
    if port_open "$port"; then return 1; fi
  done
}

# stomp_answers PORT LOGIN PASSCODE [HOST_HEADER]: a STOMP 1.2 CONNECT to $HOST:PORT with
# these credentials answers CONNECTED. HOST_HEADER is the host: header, default $HOST
# (RabbitMQ reads it as the vhost).
stomp_answers() {
  timeout 10 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "CONNECT\naccept-version:1.2\nhost:%s\nlogin:%s\npasscode:%s\nheart-beat:0,0\n\n\0" "$4" "$2" "$3" >&3
    IFS= read -r -t 8 line <&3 || exit 1
    line="${line%$'"'"'\r'"'"'}"
    [[ "$line" == CONNECTED ]] || exit 1
    # a clean goodbye (else a broker may log a connection reset): DISCONNECT with a
    # receipt, then read until the broker closes the connection after the RECEIPT
    printf "DISCONNECT\nreceipt:bye\n\n\0" >&3
    while IFS= read -r -t 3 -d "" _ <&3; do :; done
  ' "$HOST" "$1" "$2" "$3" "${4:-$HOST}" 2>/dev/null
}

# wait_until_ready PID NAME PIDFILE LOGFILE TIMEOUT PORT WHAT CHECK [ARG...]: returns once
# $HOST:PORT accepts connections and CHECK ARG... succeeds (polled every 0.25 s). Dies with
# the end of LOGFILE on stderr if PID exits (and removes PIDFILE), or after TIMEOUT seconds
# (the process keeps running). WHAT completes "NAME did not ...", e.g. "answer STOMP on
# 127.0.0.1:39613".
wait_until_ready() {
  local pid="$1" name="$2" pidfile="$3" logfile="$4" timeout="$5" port="$6" what="$7"
  shift 7
  local deadline=$((SECONDS + timeout))
  while :; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 40 "$logfile" >&2
      rm -f "$pidfile"
      die "$name (pid $pid) exited during start (log: $logfile)"
    fi
    if port_open "$port" && "$@"; then return 0; fi
    if ((SECONDS >= deadline)); then
      tail -n 40 "$logfile" >&2
      die "$name did not $what within $timeout s (pid $pid; log: $logfile; stop it with: $0 stop)"
    fi
    sleep 0.25
  done
}

# now_ns, then elapsed_since T0: the seconds since T0 with one decimal, e.g. "1.7"
now_ns() { date +%s%N; }
elapsed_since() {
  local ms=$((($(now_ns) - $1) / 1000000))
  echo "$((ms / 1000)).$((ms % 1000 / 100))"
}
