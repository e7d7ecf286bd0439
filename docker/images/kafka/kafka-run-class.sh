#!/usr/bin/env bash
# A small stand-in for Kafka's bin/kafka-run-class.sh: runs a Java class with every jar of
# /opt/kafka/libs. The bin/kafka-*.sh tools of this image call it (e.g.
# kafka-broker-api-versions.sh, which health checks run on this and the apache/kafka image).
# The same variables as Kafka's script: KAFKA_HEAP_OPTS (default -Xmx256m),
# KAFKA_JVM_PERFORMANCE_OPTS (default: C1 only and the serial GC: a short-lived JVM starts
# faster), KAFKA_LOG4J_OPTS (default: WARN and above to stderr), KAFKA_OPTS.
set -euo pipefail
[[ $# -ge 1 ]] || { echo "usage: $0 CLASS [ARG...]" >&2; exit 2; }
cmd=(java)
# word splitting of these variables is intended (as in Kafka's script)
read -r -a opts <<<"${KAFKA_HEAP_OPTS:--Xmx256m}" || true
cmd+=("${opts[@]}")
read -r -a opts <<<"${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true}" || true
cmd+=("${opts[@]}")
read -r -a opts <<<"${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=/opt/kafka/config/tools-log4j2.properties}" || true
cmd+=("${opts[@]}")
read -r -a opts <<<"${KAFKA_OPTS:-}" || true
cmd+=("${opts[@]}")
exec "${cmd[@]}" -cp "/opt/kafka/libs/*" "$@"
