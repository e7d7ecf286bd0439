#!/usr/bin/env bash
# Entrypoint of sparkeos/artemis: does what apache/activemq-artemis's docker-run.sh does.
#
# At the first start (no etc/broker.xml in /var/lib/artemis-instance yet) it creates the
# broker instance there with
#   artemis create --user $ARTEMIS_USER --password $ARTEMIS_PASSWORD --silent
#                  (--require-login | --allow-anonymous if ANONYMOUS_LOGIN=true) $EXTRA_ARGS
# and then copies every file of /var/lib/artemis-instance/etc-override/ over etc/ (this image
# ships our broker.xml there). Later starts reuse the instance: data, users and configuration
# survive a docker stop / docker start. Then: exec bin/artemis "$@" (CMD: run).
#
# JVM options: the instance's etc/artemis.profile, plus JAVA_ARGS_APPEND from the environment
# (bin/artemis appends it; the last -Xmx wins), e.g. JAVA_ARGS_APPEND="-Xmx512m".
set -euo pipefail

INSTANCE=/var/lib/artemis-instance
cd "$INSTANCE"

if [[ ! -f ./etc/broker.xml ]]; then
  if [[ "${ANONYMOUS_LOGIN,,}" == true ]]; then login=--allow-anonymous; else login=--require-login; fi
  # EXTRA_ARGS is split into words on purpose (upstream does the same)
  read -r -a extra <<<"${EXTRA_ARGS:-}" || true
  echo "docker-run.sh: creating the broker instance in $INSTANCE" >&2
  # the CLI is a short-lived JVM: C1 only, small heap
  JAVA_ARGS="-XX:TieredStopAtLevel=1 -Xmx256m" /opt/activemq-artemis/bin/artemis create \
    --user "$ARTEMIS_USER" --password "$ARTEMIS_PASSWORD" --silent "$login" "${extra[@]}" .
  if [[ -d ./etc-override ]]; then
    for file in ./etc-override/*; do
      [[ -f "$file" ]] || continue
      echo "docker-run.sh: copying $file to etc/" >&2
      cp "$file" ./etc/
    done
  fi
else
  echo "docker-run.sh: the broker instance exists already; not creating it" >&2
fi

exec ./bin/artemis "$@"
