#!/usr/bin/env bash
# A real Apache Kafka broker (KRaft, one combined broker+controller node) as a
# local process, for development and integration tests. No Docker.
#
#   bash docker/services/kafka.sh fetch       # jars from Maven Central (once)
#   bash docker/services/kafka.sh start       # fetch if needed, format once, start, wait
#   bash docker/services/kafka.sh status      # exit 0 if running, 3 if not
#   bash docker/services/kafka.sh stop        # TERM by pid file, then KILL
#   bash docker/services/kafka.sh spark-jars  # comma-separated jars for spark.jars
#
# Environment:
#   SPARKEOS_SERVICES_DIR            default <repo>/.services
#   SPARKEOS_KAFKA_VERSION           broker version, default 4.3.1
#   SPARKEOS_KAFKA_PORT              client port, default 29092
#   SPARKEOS_KAFKA_CONTROLLER_PORT   KRaft controller port, default 29093
#   SPARKEOS_KAFKA_HEAP              default 512m
#   SPARKEOS_KAFKA_JAVA_OPTS         extra JVM options, default -XX:TieredStopAtLevel=1 (C1 only:
#                                    starts ~1.7 s faster; set it to "" for benchmarks)
#   SPARKEOS_KAFKA_LOG_LEVEL         root log4j2 level, default WARN
#   SPARKEOS_KAFKA_START_TIMEOUT     seconds, default 60
#   SPARKEOS_KAFKA_INSTANCE          a second broker beside the default one: its own data, config
#                                    and pid under .services/kafka-<instance> (jars shared)
#   SPARKEOS_KAFKA_EXTRA_CONFIG      lines appended to server.properties (e.g. a short
#                                    offsets.retention.minutes for the marker-expiry test)
#   SPARKEOS_SPARK_VERSION           default: the installed pyspark's version
#   SPARKEOS_SPARK_KAFKA_VERSIONS    connector versions to try, "SQLKAFKA[/TOKENPROVIDER] ...";
#                                    default: the Spark version, then known fallbacks
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"   # REPO, SERVICES_DIR, HOST, log, die, take_lock, pids, ports

KAFKA_VERSION="${SPARKEOS_KAFKA_VERSION:-4.3.1}"
LOG4J_VERSION="2.25.4"          # log4j2 binding for slf4j 1.x (what Kafka 4.x logs through)
PORT="${SPARKEOS_KAFKA_PORT:-29092}"
CONTROLLER_PORT="${SPARKEOS_KAFKA_CONTROLLER_PORT:-29093}"
HEAP="${SPARKEOS_KAFKA_HEAP:-512m}"
JAVA_OPTS="${SPARKEOS_KAFKA_JAVA_OPTS--XX:TieredStopAtLevel=1}"
LOG_LEVEL="${SPARKEOS_KAFKA_LOG_LEVEL:-WARN}"
START_TIMEOUT="${SPARKEOS_KAFKA_START_TIMEOUT:-60}"

EXTRA_CONFIG="${SPARKEOS_KAFKA_EXTRA_CONFIG:-}"
JARDIR="$SERVICES_DIR/kafka"
LIB="$JARDIR/lib"
KDIR="$SERVICES_DIR/kafka${SPARKEOS_KAFKA_INSTANCE:+-$SPARKEOS_KAFKA_INSTANCE}"
DATA="$KDIR/data"
PROPS="$KDIR/server.properties"
LOG4J_CONF="$KDIR/log4j2.properties"
PIDFILE="$KDIR/kafka.pid"
LOGFILE="$KDIR/kafka.log"
SPARK_JARS="$SERVICES_DIR/spark-jars"

if [[ -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"; else PY="$(command -v python3 || true)"; fi

# ---------------------------------------------------------------- fetch

fetch_kafka() {
  # kafka_2.13 holds kafka.Kafka (the server main) and kafka.tools.StorageTool
  # (the KRaft 'format'); it pulls kafka-server, -raft, -metadata, -storage,
  # coordinators, log4j-core/api. Kafka logs through slf4j 1.7, so add the
  # log4j2 binding for slf4j 1.x (the distribution ships it in libs/ too).
  fetch_jars "$LIB" "$JARDIR" kafka-broker ".fetched-$KAFKA_VERSION" "Apache Kafka $KAFKA_VERSION" <<EOF
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>$LOG4J_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId><version>$LOG4J_VERSION</version></dependency>
EOF
}

pyspark_version() {
  if [[ -n "${SPARKEOS_SPARK_VERSION:-}" ]]; then echo "$SPARKEOS_SPARK_VERSION"; return; fi
  [[ -n "$PY" ]] || return 0
  "$PY" -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null || true
}

pyspark_jars_dir() {
  [[ -n "$PY" ]] || return 0
  "$PY" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))' 2>/dev/null || true
}

# artifact name of a jar file: strip "-<version>.jar" (version starts with a digit)
jar_name() { basename "$1" | sed -E 's/-[0-9][^/]*\.jar$//'; }

fetch_spark_jars() {
  local spark_version; spark_version="$(pyspark_version)"
  if [[ -z "$spark_version" ]]; then
    log "WARNING: pyspark not found; skipping Spark's Kafka connector"
    return 0
  fi
  local marker="$SPARK_JARS/.fetched-$spark_version"
  if [[ -f "$marker" ]]; then return 0; fi
  local t0=$SECONDS
  local major="${spark_version%%.*}"
  # Candidates "SQLKAFKA/TOKENPROVIDER". The exact version first. The Maven
  # Central this project reaches may lack some Spark releases (seen: no 4.3.0
  # at all; spark-token-provider-kafka-0-10 only as 4.0.0), hence fallbacks.
  local candidates="${SPARKEOS_SPARK_KAFKA_VERSIONS:-}"
  if [[ -z "$candidates" ]]; then
    candidates="$spark_version/$spark_version"
    if [[ "$major" == 4 ]]; then candidates="$candidates 4.2.0/4.0.0 4.0.0/4.0.0"; fi
  fi
  local work="$SERVICES_DIR/spark-kafka-pom" cand sql tok chosen=""
  mkdir -p "$work"
  for cand in $candidates; do
    sql="${cand%%/*}"; tok="${cand#*/}"; [[ "$cand" == */* ]] || tok="$sql"
    log "fetching spark-sql-kafka-0-10_2.13:$sql (+ token provider $tok) for Spark $spark_version ..."
    write_pom "$work/pom.xml" spark-kafka <<EOF
    <dependency>
      <groupId>org.apache.spark</groupId><artifactId>spark-sql-kafka-0-10_2.13</artifactId><version>$sql</version>
      <exclusions><exclusion><groupId>org.apache.spark</groupId><artifactId>spark-token-provider-kafka-0-10_2.13</artifactId></exclusion></exclusions>
    </dependency>
    <dependency><groupId>org.apache.spark</groupId><artifactId>spark-token-provider-kafka-0-10_2.13</artifactId><version>$tok</version></dependency>
EOF
    if mvn_copy "$work" "$SPARK_JARS"; then chosen="$sql/$tok"; break; fi
    log "  not resolvable ($(grep -m1 -o 'Could not [^(]*' "$work/mvn.log" || echo "see $work/mvn.log"))"
  done
  [[ -n "$chosen" ]] || die "no Spark Kafka connector resolvable for Spark $spark_version (tried: $candidates)"
  # drop what Spark already ships (same artifact name in pyspark/jars)
  local shipped; shipped="$(pyspark_jars_dir)"
  if [[ -d "$shipped" ]]; then
    local have f
    have="$(for f in "$shipped"/*.jar; do jar_name "$f"; done | sort -u)"
    for f in "$SPARK_JARS.tmp"/*.jar; do
      if grep -qxF "$(jar_name "$f")" <<<"$have"; then rm -f "$f"; fi
    done
  fi
  rm -rf "$SPARK_JARS"
  mv "$SPARK_JARS.tmp" "$SPARK_JARS"
  echo "spark=$spark_version spark-sql-kafka=${chosen%/*} spark-token-provider-kafka=${chosen#*/}" >"$SPARK_JARS/VERSIONS"
  touch "$marker"
  if [[ "$chosen" != "$spark_version/$spark_version" ]]; then
    log "WARNING: Spark $spark_version uses the Kafka connector $chosen (exact version not on Maven Central here)"
  fi
  log "Spark Kafka jars: $(ls "$SPARK_JARS"/*.jar | xargs -n1 basename | tr '\n' ' ')($((SECONDS - t0)) s)"
}

cmd_fetch() { fetch_kafka; fetch_spark_jars; }

cmd_spark_jars() {
  fetch_spark_jars
  local jars=("$SPARK_JARS"/*.jar)
  [[ -e "${jars[0]}" ]] || die "no jars in $SPARK_JARS"
  (IFS=,; echo "${jars[*]}")
}

# ---------------------------------------------------------------- process

# alive AND really our broker (guards against a recycled pid)
pid_is_ours() { pid_cmdline_has "$1" "kafka.Kafka $PROPS"; }

broker_answers() { # a Kafka metadata round trip, or a TCP connect without confluent_kafka
  if [[ -n "$PY" ]] && "$PY" -c 'import confluent_kafka' 2>/dev/null; then
    "$PY" - "$HOST:$PORT" <<'EOF' >/dev/null 2>&1
import sys
from confluent_kafka.admin import AdminClient
md = AdminClient({"bootstrap.servers": sys.argv[1]}).list_topics(timeout=5)
sys.exit(0 if md.brokers else 1)
EOF
  else
    port_open "$PORT"
  fi
}

write_config() {
  mkdir -p "$DATA"
  cat >"$PROPS" <<EOF
# generated by docker/services/kafka.sh: single KRaft node for tests
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$DATA
num.partitions=2
auto.create.topics.enable=true
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=2
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=2
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
log.retention.hours=24
log.segment.bytes=16777216
$EXTRA_CONFIG
EOF
  cat >"$LOG4J_CONF" <<EOF
# generated by docker/services/kafka.sh
status = error
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = $LOG_LEVEL
rootLogger.appenderRef.out.ref = STDOUT
# keep the one line that says the server is up
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = INFO
EOF
}

JAVA=()
set_java() { # the java command line, main class and args to follow
  command -v java >/dev/null || die "java not found (apt-get install openjdk-17-jre-headless)"
  local extra=()
  read -r -a extra <<<"$JAVA_OPTS" || true
  JAVA=(java -Xms128m "-Xmx$HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError
    "${extra[@]}" -Djava.awt.headless=true "-Dlog4j2.configurationFile=$LOG4J_CONF" -cp "$LIB/*")
}

format_storage() {
  if [[ -f "$DATA/meta.properties" ]]; then return 0; fi
  local cluster_id
  if [[ -n "$PY" ]]; then
    # as Kafka's own Uuid.randomUuid: an ID starting with '-' would be read as an option
    cluster_id="$("$PY" -c 'import base64, uuid
while (i := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"): pass
print(i)')"
  else
    cluster_id="$("${JAVA[@]}" kafka.tools.StorageTool random-uuid | tail -n1)"
  fi
  log "formatting KRaft storage in $DATA (cluster id $cluster_id)"
  "${JAVA[@]}" kafka.tools.StorageTool format --ignore-formatted "--cluster-id=$cluster_id" -c "$PROPS" \
    >"$KDIR/format.log" 2>&1 || { cat "$KDIR/format.log" >&2; die "kafka-storage format failed"; }
}

wait_ready() { # $1 = pid; returns when the broker answers, dies on exit or timeout
  wait_until_ready "$1" Kafka "$PIDFILE" "$LOGFILE" "$START_TIMEOUT" "$PORT" "answer on $HOST:$PORT" broker_answers
}

cmd_start() {
  take_lock "$KDIR"
  local pid
  if pid="$(our_pid "$PIDFILE" pid_is_ours)"; then   # already running (or still starting): just wait for it
    wait_ready "$pid"
    echo "bootstrap=$HOST:$PORT"
    return 0
  fi
  rm -f "$PIDFILE"
  ports_free "$PORT" "$CONTROLLER_PORT" \
    || die "port $PORT or $CONTROLLER_PORT already in use by another process (set SPARKEOS_KAFKA_PORT / SPARKEOS_KAFKA_CONTROLLER_PORT)"
  fetch_kafka
  # the broker does not need Spark's connector: a failure there only warns
  (fetch_spark_jars) || log "WARNING: Spark's Kafka connector not fetched (run: $0 fetch)"
  write_config
  set_java
  format_storage
  local t0; t0="$(now_ns)"
  echo "==== $(date -Is) starting Kafka $KAFKA_VERSION on $HOST:$PORT" >>"$LOGFILE"
  # spawn: the child writes its own pid and execs java, so the pid file names the JVM;
  # its own session, so it outlives the caller's process group.
  spawn "$PIDFILE" "$LOGFILE" . "${JAVA[@]}" kafka.Kafka "$PROPS"
  pid="$(await_pid "$PIDFILE")"
  [[ -n "$pid" ]] || die "Kafka process did not start (log: $LOGFILE)"
  wait_ready "$pid"
  log "Kafka $KAFKA_VERSION up, pid $pid, $(elapsed_since "$t0") s"
  echo "bootstrap=$HOST:$PORT"
}

cmd_stop() {
  take_lock "$KDIR"
  stop_pidfile "$PIDFILE" pid_is_ours
}

cmd_status() {
  service_status "$PIDFILE" pid_is_ours "bootstrap=$HOST:$PORT version=$KAFKA_VERSION" "bootstrap=$HOST:$PORT" \
    broker_answers
}

case "${1:-}" in
  fetch) cmd_fetch ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  spark-jars) cmd_spark_jars ;;
  *) echo "usage: $0 {fetch|start|stop|status|spark-jars}" >&2; exit 2 ;;
esac
