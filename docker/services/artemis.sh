#!/usr/bin/env bash
# A real ActiveMQ Artemis broker (STOMP) as a local process, for development and
# integration tests. No Docker.
#
#   bash docker/services/artemis.sh fetch       # the distribution from Maven Central (once)
#   bash docker/services/artemis.sh start       # fetch if needed, create the instance once, start, wait
#   bash docker/services/artemis.sh status      # exit 0 if running, 3 if not
#   bash docker/services/artemis.sh stop        # TERM by pid file, then KILL
#   bash docker/services/artemis.sh queue-stat QUEUE
#                                               # one line for exactly that queue (see cmd_queue_stat):
#                                               # name=QUEUE messageCount=3 deliveringCount=0 ...
#                                               # exit 4 and nothing on stdout if it does not exist
#
# start prints "stomp=127.0.0.1:<port>" and "core=tcp://127.0.0.1:<core port>" on stdout.
# Credentials: admin / admin (login required). The instance has two acceptors, both on
# loopback only: STOMP, and CORE (what the `artemis` CLI, e.g. queue-stat, talks to).
# Queues and addresses are auto-created; duplicate detection (_AMQ_DUPL_ID) keeps the
# last SPARKEOS_ARTEMIS_ID_CACHE_SIZE ids per address, persisted in the journal.
# The STOMP acceptor also has anycastPrefix=/queue/ and multicastPrefix=/topic/: a SEND or
# SUBSCRIBE to "/queue/q" means the ANYCAST queue "q" (as on ActiveMQ Classic and RabbitMQ);
# a bare "q" still works with destination-type / subscription-type ANYCAST headers.
#
# Environment:
#   SPARKEOS_SERVICES_DIR            default <repo>/.services
#   SPARKEOS_ARTEMIS_VERSION         default 2.56.0 (groupId org.apache.artemis: 2.41+); the instance
#                                    names its distribution: after a change, rm -rf the instance dir
#   SPARKEOS_ARTEMIS_PORT            STOMP port, default 29613
#   SPARKEOS_ARTEMIS_CORE_PORT       CORE port, default 29616
#   SPARKEOS_ARTEMIS_ID_CACHE_SIZE   duplicate-id cache per address (address-settings "#"), default 20000
#   SPARKEOS_ARTEMIS_HEAP            default 512m
#   SPARKEOS_ARTEMIS_JAVA_OPTS       extra JVM options, default -XX:TieredStopAtLevel=1 (C1 only:
#                                    starts faster; set it to "" for benchmarks)
#   SPARKEOS_ARTEMIS_START_TIMEOUT   seconds, default 90
#   SPARKEOS_ARTEMIS_INSTANCE        a second broker beside the default one: its own instance
#                                    (data, config, pid, log) under .services/artemis-<instance>
#                                    (give it other ports too); the distribution is shared
#
# The broker.xml and artemis.profile of the instance are regenerated on every start from the
# pristine copies the CLI created (*.orig), so changed settings take effect at the next start.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # REPO, SERVICES_DIR, HOST, log, die, take_lock, pids, ports

ARTEMIS_VERSION="${SPARKEOS_ARTEMIS_VERSION:-2.56.0}"
PORT="${SPARKEOS_ARTEMIS_PORT:-29613}"
CORE_PORT="${SPARKEOS_ARTEMIS_CORE_PORT:-29616}"
ID_CACHE_SIZE="${SPARKEOS_ARTEMIS_ID_CACHE_SIZE:-20000}"
HEAP="${SPARKEOS_ARTEMIS_HEAP:-512m}"
JAVA_OPTS="${SPARKEOS_ARTEMIS_JAVA_OPTS--XX:TieredStopAtLevel=1}"
START_TIMEOUT="${SPARKEOS_ARTEMIS_START_TIMEOUT:-90}"
USER_NAME=admin
PASSWORD=admin

DISTDIR="$SERVICES_DIR/artemis"
HOME_DIR="$DISTDIR/apache-artemis-$ARTEMIS_VERSION"
ADIR="$SERVICES_DIR/artemis${SPARKEOS_ARTEMIS_INSTANCE:+-$SPARKEOS_ARTEMIS_INSTANCE}"
INSTANCE="$ADIR/instance"
PIDFILE="$ADIR/artemis.pid"
LOGFILE="$ADIR/artemis.log"

[[ "$PORT" =~ ^[0-9]+$ && "$CORE_PORT" =~ ^[0-9]+$ ]] || die "ports must be numbers"
[[ "$ID_CACHE_SIZE" =~ ^[0-9]+$ ]] || die "SPARKEOS_ARTEMIS_ID_CACHE_SIZE must be a number"

# ---------------------------------------------------------------- fetch

cmd_fetch() {
  if [[ -x "$HOME_DIR/bin/artemis" && -f "$HOME_DIR/.fetched" ]]; then return 0; fi
  command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
  local t0=$SECONDS
  local artifact="org.apache.artemis:apache-artemis:$ARTEMIS_VERSION:tar.gz:bin"
  local tarball="${HOME}/.m2/repository/org/apache/artemis/apache-artemis/$ARTEMIS_VERSION/apache-artemis-$ARTEMIS_VERSION-bin.tar.gz"
  mkdir -p "$DISTDIR"
  if [[ ! -f "$tarball" ]]; then
    log "fetching ActiveMQ Artemis $ARTEMIS_VERSION from Maven Central ..."
    if ! mvn -B -q dependency:get "-Dartifact=$artifact" -Dtransitive=false >"$DISTDIR/mvn.log" 2>&1; then
      tail -n 30 "$DISTDIR/mvn.log" >&2
      die "could not fetch $artifact (log: $DISTDIR/mvn.log)"
    fi
  fi
  [[ -f "$tarball" ]] || die "mvn succeeded but $tarball is missing (a different local repository?)"
  rm -rf "$HOME_DIR" "$DISTDIR/unpack.tmp"
  mkdir -p "$DISTDIR/unpack.tmp"
  tar -xzf "$tarball" -C "$DISTDIR/unpack.tmp"
  [[ -x "$DISTDIR/unpack.tmp/apache-artemis-$ARTEMIS_VERSION/bin/artemis" ]] \
    || die "unexpected tarball layout in $tarball"
  mv "$DISTDIR/unpack.tmp/apache-artemis-$ARTEMIS_VERSION" "$HOME_DIR"
  rmdir "$DISTDIR/unpack.tmp"
  touch "$HOME_DIR/.fetched"
  log "Artemis $ARTEMIS_VERSION in $HOME_DIR ($(du -sh "$HOME_DIR" | cut -f1), $((SECONDS - t0)) s)"
}

# ---------------------------------------------------------------- instance

create_instance() {
  if [[ -f "$INSTANCE/etc/broker.xml.orig" ]]; then return 0; fi
  command -v java >/dev/null || die "java not found (apt-get install openjdk-17-jre-headless)"
  rm -rf "$INSTANCE"
  mkdir -p "$ADIR"
  log "creating the broker instance $INSTANCE"
  # the CLI itself runs with the home's defaults; keep the caller's JAVA_ARGS out of it
  if ! env -u JAVA_ARGS "$HOME_DIR/bin/artemis" create "$INSTANCE" --user "$USER_NAME" --password "$PASSWORD" \
      --require-login --silent --host "$HOST" --no-web --no-amqp-acceptor --no-mqtt-acceptor \
      --no-hornetq-acceptor --nio >"$ADIR/create.log" 2>&1; then
    cat "$ADIR/create.log" >&2
    rm -rf "$INSTANCE"
    die "artemis create failed (log: $ADIR/create.log)"
  fi
  cp "$INSTANCE/etc/artemis.profile" "$INSTANCE/etc/artemis.profile.orig"
  cp "$INSTANCE/etc/broker.xml" "$INSTANCE/etc/broker.xml.orig"  # last: marks a complete instance
}

write_config() {
  local etc="$INSTANCE/etc"
  # acceptors: only CORE (named "artemis", which the CLI looks up for its default URL)
  # and STOMP, both on loopback; id-cache-size on the "#" address-setting.
  ACCEPTORS="      <acceptors>
         <!-- generated by docker/services/artemis.sh -->
         <acceptor name=\"artemis\">tcp://$HOST:$CORE_PORT?protocols=CORE;useEpoll=true;supportAdvisory=false;suppressInternalManagementObjects=false</acceptor>
         <acceptor name=\"stomp\">tcp://$HOST:$PORT?tcpSendBufferSize=1048576;tcpReceiveBufferSize=1048576;protocols=STOMP;useEpoll=true;anycastPrefix=/queue/;multicastPrefix=/topic/</acceptor>
      </acceptors>" \
  IDCACHE="$ID_CACHE_SIZE" \
  perl -0pe '
      s{^[ \t]*<acceptors>.*?</acceptors>}{$ENV{ACCEPTORS}}ms or die "no <acceptors> in broker.xml\n";
      s{(<address-setting match="#">)}{$1\n            <id-cache-size>$ENV{IDCACHE}</id-cache-size>} or die "no address-setting # in broker.xml\n";
    ' "$etc/broker.xml.orig" >"$etc/broker.xml.tmp"
  # auto-creation is what the STOMP tests rely on: refuse a config without it
  local setting
  for setting in auto-create-queues auto-create-addresses; do
    perl -0ne 'exit(m{<address-setting match="#">(?:(?!</address-setting>).)*<'"$setting"'>true</'"$setting"'>}s ? 0 : 1)' \
      "$etc/broker.xml.tmp" || die "broker.xml: <$setting> is not true for address-setting #"
  done
  mv "$etc/broker.xml.tmp" "$etc/broker.xml"

  # JVM: small heap, the caller's extra options; keep the other defaults of the profile
  local extra="-Xms64m -Xmx$HEAP -XX:+ExitOnOutOfMemoryError $JAVA_OPTS"
  EXTRA="$extra" perl -pe '
      if (/^\s*JAVA_ARGS="/) { s/-Xms\S+\s*//; s/-Xmx\S+\s*//; s/^(\s*JAVA_ARGS=")/$1$ENV{EXTRA} /; $done = 1 }
      END { die "no JAVA_ARGS line in artemis.profile\n" unless $done }
    ' "$etc/artemis.profile.orig" >"$etc/artemis.profile.tmp"
  mv "$etc/artemis.profile.tmp" "$etc/artemis.profile"
}

# ---------------------------------------------------------------- process

# alive AND really our broker (guards against a recycled pid)
pid_is_ours() {
  pid_cmdline_has "$1" "-Dartemis.instance=$INSTANCE " "org.apache.activemq.artemis.boot.Artemis run"
}

# a STOMP 1.2 CONNECT with the credentials answers CONNECTED
answers() { stomp_answers "$PORT" "$USER_NAME" "$PASSWORD"; }

wait_ready() { # $1 = pid; returns when the broker answers, dies on exit or timeout
  wait_until_ready "$1" Artemis "$PIDFILE" "$LOGFILE" "$START_TIMEOUT" "$PORT" "answer STOMP on $HOST:$PORT" answers
}

print_urls() {
  echo "stomp=$HOST:$PORT"
  echo "core=tcp://$HOST:$CORE_PORT"
}

cmd_start() {
  take_lock "$ADIR"
  local pid
  if pid="$(our_pid "$PIDFILE" pid_is_ours)"; then   # already running (or still starting): just wait for it
    wait_ready "$pid"
    print_urls
    return 0
  fi
  rm -f "$PIDFILE"
  ports_free "$PORT" "$CORE_PORT" \
    || die "port $PORT or $CORE_PORT already in use by another process (set SPARKEOS_ARTEMIS_PORT / SPARKEOS_ARTEMIS_CORE_PORT)"
  cmd_fetch
  create_instance
  write_config
  local t0; t0="$(now_ns)"
  echo "==== $(date -Is) starting Artemis $ARTEMIS_VERSION, STOMP on $HOST:$PORT, CORE on $HOST:$CORE_PORT" >>"$LOGFILE"
  # spawn: the child writes its own pid and execs bin/artemis, which execs java: the pid
  # file names the JVM; its own session, so it outlives the caller's process group.
  # JAVA_ARGS unset: the profile's line (written above) applies.
  spawn "$PIDFILE" "$LOGFILE" . env -u JAVA_ARGS -u JAVA_ARGS_APPEND "$INSTANCE/bin/artemis" run
  pid="$(await_pid "$PIDFILE")"
  [[ -n "$pid" ]] || die "Artemis process did not start (log: $LOGFILE)"
  wait_ready "$pid"
  log "Artemis $ARTEMIS_VERSION up, pid $pid, $(elapsed_since "$t0") s"
  print_urls
}

cmd_stop() {
  take_lock "$ADIR"
  stop_pidfile "$PIDFILE" pid_is_ours
}

cmd_status() {
  service_status "$PIDFILE" pid_is_ours \
    "stomp=$HOST:$PORT core=tcp://$HOST:$CORE_PORT version=$ARTEMIS_VERSION" "stomp=$HOST:$PORT" answers
}

# ---------------------------------------------------------------- queue stat

# One line for exactly the queue $1 (the CLI's --queueName matches substrings, so filter
# on NAME EQUALS), from `artemis queue stat --json` (2.56.0 prints
# {"data":[{"id":"25","name":"q","messageCount":"3",...}],"count":1}):
#   name=q messageCount=3 deliveringCount=0 consumerCount=0 messagesAdded=3 messagesAcked=0 scheduledCount=0
# messageCount includes scheduled, paged and delivered-but-unacknowledged messages; exit 4 if
# there is no such queue (not auto-created yet, or deleted).
cmd_queue_stat() {
  local queue="${1:-}"
  [[ -n "$queue" ]] || die "usage: $0 queue-stat QUEUE"
  [[ -x "$INSTANCE/bin/artemis" ]] || die "no instance in $INSTANCE (run: $0 start)"
  local out
  # the utility profile of the instance; C1 only: the CLI is a short-lived JVM
  if ! out="$(JAVA_ARGS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xmx128m -Dlog4j2.disableJmx=true --add-opens java.base/jdk.internal.misc=ALL-UNNAMED" \
      "$INSTANCE/bin/artemis" queue stat --silent --json --url "tcp://$HOST:$CORE_PORT" \
      --user "$USER_NAME" --password "$PASSWORD" \
      --field NAME --operation EQUALS --value "$queue" 2>&1)"; then
    printf '%s\n' "$out" >&2
    die "artemis queue stat failed"
  fi
  QUEUE="$queue" perl -0ne '
      # the JSON document is the last {...} of the output (the CLI may print a banner first)
      /(\{.*\})\s*\z/s or do { print STDERR "no JSON in: $_"; exit 1 };
      my $doc = $1;
      my $found = 0;
      while ($doc =~ /\{([^{}]*)\}/g) {
        my $o = $1; my %f;
        while ($o =~ /"(\w+)"\s*:\s*"?([^",]*)"?/g) { $f{$1} = $2 }
        next unless defined $f{name} && $f{name} eq $ENV{QUEUE};
        print join(" ", map { "$_=" . ($f{$_} // "?") }
                   qw(name messageCount deliveringCount consumerCount messagesAdded messagesAcked
                      scheduledCount)), "\n";
        $found = 1;
      }
      exit($found ? 0 : 4);
    ' <<<"$out"
}

case "${1:-}" in
  fetch) cmd_fetch ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  queue-stat) shift; cmd_queue_stat "$@" ;;
  *) echo "usage: $0 {fetch|start|stop|status|queue-stat QUEUE}" >&2; exit 2 ;;
esac
