#!/usr/bin/env bash
# Builds the container images of the integration tests without any image registry: the
# Debian base images come from debootstrap (deb.debian.org), the brokers' jars from Maven
# Central (fetched on the host: containers here cannot reach it over HTTPS).
#
#   bash docker/images/build.sh [postgres] [kafka] [artemis]   # default: all three
#   bash docker/images/build.sh --help
#
# Images:
#   sparkeos/debian:bookworm       debootstrap --variant=minbase, docker import (base of kafka, artemis)
#   sparkeos/debian:trixie         the same for Debian 13 (base of postgres: PostgreSQL 17 is
#                                  trixie's; bookworm has 15 and bookworm-backports no 17)
#   sparkeos/postgres:<major>      docker/images/postgres, interface of postgres:<major>
#   sparkeos/kafka:<version>       docker/images/kafka, interface of apache/kafka:<version>
#   sparkeos/artemis:<version>     docker/images/artemis, interface of apache/activemq-artemis:<version>
#
# Prints one line per image built, at the end, on stdout:
#   image postgres=sparkeos/postgres:17
#   image kafka=sparkeos/kafka:4.3.1
#   image artemis=sparkeos/artemis:2.56.0
# (export them for docker/compose.yaml as SPARKEOS_POSTGRES_IMAGE, SPARKEOS_KAFKA_IMAGE,
# SPARKEOS_ARTEMIS_IMAGE). Messages and build logs go to stderr and
# $SPARKEOS_SERVICES_DIR/docker/build-logs/.
#
# Caching: a base image that exists is not rebuilt (`docker rmi sparkeos/debian:<suite>` to
# refresh it); the jars and the Artemis distribution are fetched once (docker/services/
# kafka.sh and artemis.sh fetch); the build contexts are reassembled on every run from hard
# links, with the same contents, so `docker build` reuses its layer cache: a second run takes
# seconds.
#
# Environment:
#   SPARKEOS_SERVICES_DIR       default <repo>/.services (state: .services/docker)
#   SPARKEOS_POSTGRES_MAJOR     17 (Debian trixie) or 15 (Debian bookworm); default 17
#   SPARKEOS_KAFKA_VERSION      default 4.3.1, as docker/services/kafka.sh
#   SPARKEOS_ARTEMIS_VERSION    default 2.56.0, as docker/services/artemis.sh
#   SPARKEOS_DEBIAN_MIRROR      default http://deb.debian.org/debian
set -euo pipefail

# shellcheck source=../services/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../services/lib.sh"   # REPO, SERVICES_DIR, log, die, apt_install, fetch_jars

IMAGES_DIR="$REPO/docker/images"
STATE="$SERVICES_DIR/docker"
CONTEXTS="$STATE/context"
LOGS="$STATE/build-logs"
MIRROR="${SPARKEOS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${MIRROR%/debian}/debian-security"

PG_MAJOR="${SPARKEOS_POSTGRES_MAJOR:-17}"
KAFKA_VERSION="${SPARKEOS_KAFKA_VERSION:-4.3.1}"
ARTEMIS_VERSION="${SPARKEOS_ARTEMIS_VERSION:-2.56.0}"

case "$PG_MAJOR" in
  17) PG_SUITE=trixie ;;     # Debian 13's PostgreSQL
  15) PG_SUITE=bookworm ;;   # Debian 12's
  *) die "SPARKEOS_POSTGRES_MAJOR=$PG_MAJOR: only 17 (trixie) and 15 (bookworm) come from deb.debian.org" ;;
esac
JAVA_SUITE=bookworm          # openjdk-17-jre-headless

POSTGRES_IMAGE="sparkeos/postgres:$PG_MAJOR"
KAFKA_IMAGE="sparkeos/kafka:$KAFKA_VERSION"
ARTEMIS_IMAGE="sparkeos/artemis:$ARTEMIS_VERSION"

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

# ---------------------------------------------------------------- arguments

WANT=()
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    postgres|kafka|artemis) WANT+=("$arg") ;;
    *) usage >&2; die "unknown argument: $arg" ;;
  esac
done
[[ ${#WANT[@]} -gt 0 ]] || WANT=(postgres kafka artemis)
wants() { [[ " ${WANT[*]} " == *" $1 "* ]]; }

# ---------------------------------------------------------------- helpers

as_root=()
[[ "$(id -u)" == 0 ]] || as_root=(sudo -n)

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# The classic builder: it is all Docker 20.10 has without the buildx plugin (newer clients
# without buildx still fall back to it). With buildx present, BuildKit is used.
if ! docker buildx version >/dev/null 2>&1; then export DOCKER_BUILDKIT=0; fi

# build_base SUITE: the image sparkeos/debian:SUITE, once. debootstrap --variant=minbase
# (~1 min), a few settings a container image wants, then docker import of the tree.
build_base() {
  local suite="$1" image="sparkeos/debian:$1" t0=$SECONDS
  if image_exists "$image"; then log "$image exists (cached)"; return 0; fi
  local rootfs="$STATE/rootfs-$suite"
  "${as_root[@]}" rm -rf "$rootfs"
  mkdir -p "$rootfs"
  log "debootstrap $suite from $MIRROR (log: $LOGS/debootstrap-$suite.log) ..."
  if ! "${as_root[@]}" debootstrap --variant=minbase "$suite" "$rootfs" "$MIRROR" \
      >"$LOGS/debootstrap-$suite.log" 2>&1; then
    tail -n 20 "$LOGS/debootstrap-$suite.log" >&2
    die "debootstrap $suite failed (log: $LOGS/debootstrap-$suite.log)"
  fi
  # apt sources: the release, its updates and its security archive (plain http: it is what
  # works inside containers here; apt checks the signatures)
  "${as_root[@]}" tee "$rootfs/etc/apt/sources.list" >/dev/null <<EOF
deb $MIRROR $suite main
deb $MIRROR $suite-updates main
deb $SECURITY_MIRROR $suite-security main
EOF
  # what the official Debian images do: no recommends, no apt caches, no documentation
  # (the copyright files stay), no service starts from maintainer scripts
  "${as_root[@]}" tee "$rootfs/etc/apt/apt.conf.d/90sparkeos" >/dev/null <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  "${as_root[@]}" mkdir -p "$rootfs/etc/dpkg/dpkg.cfg.d"
  "${as_root[@]}" tee "$rootfs/etc/dpkg/dpkg.cfg.d/90sparkeos-nodoc" >/dev/null <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
EOF
  printf '#!/bin/sh\n# no daemons started by package installs in an image build\nexit 101\n' \
    | "${as_root[@]}" tee "$rootfs/usr/sbin/policy-rc.d" >/dev/null
  "${as_root[@]}" chmod 755 "$rootfs/usr/sbin/policy-rc.d"
  # debootstrap leaves the host's name and resolver in the tree; docker provides both
  "${as_root[@]}" sh -c "rm -rf '$rootfs'/var/lib/apt/lists/* '$rootfs'/var/cache/apt/*.bin \
    '$rootfs'/var/cache/apt/archives/*.deb '$rootfs'/var/log/*.log '$rootfs'/tmp/*; \
    : >'$rootfs/etc/resolv.conf'; echo localhost >'$rootfs/etc/hostname'; : >'$rootfs/etc/machine-id'"
  log "docker import $image ..."
  # --numeric-owner: the tree's uids, not the host's names for them
  "${as_root[@]}" tar --numeric-owner -C "$rootfs" -c . \
    | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'ENV LANG=C.UTF-8' \
        -c 'CMD ["bash"]' \
        -m "debootstrap --variant=minbase $suite $MIRROR" - "$image" >/dev/null
  "${as_root[@]}" rm -rf "$rootfs"
  log "$image built in $((SECONDS - t0)) s"
}

# link_tree SRC DEST: DEST becomes a copy of SRC made of hard links (instant, no space);
# a plain copy where links are impossible (another file system)
link_tree() {
  rm -rf "$2"
  mkdir -p "$(dirname "$2")"
  cp -al "$1" "$2" 2>/dev/null || { rm -rf "$2"; cp -a "$1" "$2"; }
}

# new_context NAME: $CONTEXTS/NAME, fresh, with the files of docker/images/NAME (cp -p: the
# same contents and modes every time, so the build cache matches)
new_context() {
  local ctx="$CONTEXTS/$1"
  rm -rf "$ctx"
  mkdir -p "$ctx"
  cp -pr "$IMAGES_DIR/$1/." "$ctx/"
  echo "$ctx"
}

# docker_build NAME IMAGE CONTEXT [BUILD ARGS...]: docker build, output to the log
docker_build() {
  local name="$1" image="$2" ctx="$3" t0=$SECONDS
  shift 3
  log "docker build $image (log: $LOGS/$name.log) ..."
  if ! docker build -t "$image" --label "org.opencontainers.image.source=sparkeos docker/images/$name" \
      "$@" "$ctx" >"$LOGS/$name.log" 2>&1; then
    tail -n 30 "$LOGS/$name.log" >&2
    die "docker build of $image failed (log: $LOGS/$name.log)"
  fi
  local cached steps
  cached="$(grep -c 'Using cache' "$LOGS/$name.log" || true)"
  steps="$(grep -c '^Step ' "$LOGS/$name.log" || true)"
  if [[ "$steps" -gt 0 ]]; then
    log "$image built in $((SECONDS - t0)) s ($cached of $steps steps from the cache)"
  else
    log "$image built in $((SECONDS - t0)) s"
  fi
}

# ---------------------------------------------------------------- the images

build_postgres() {
  build_base "$PG_SUITE"
  local ctx; ctx="$(new_context postgres)"
  docker_build postgres "$POSTGRES_IMAGE" "$ctx" \
    --build-arg "BASE=sparkeos/debian:$PG_SUITE" --build-arg "PG_MAJOR=$PG_MAJOR"
}

# Kafka's jars: the broker's (docker/services/kafka.sh fetch, shared with the local broker)
# plus kafka-tools alone, for bin/kafka-broker-api-versions.sh and friends (its other
# dependencies are the broker's already, or Kafka Connect's, which the tools used here do
# not need).
fetch_kafka() {
  local broker_lib="$SERVICES_DIR/kafka/lib" tools_lib="$STATE/kafka-tools/lib"
  if ! SPARKEOS_KAFKA_VERSION="$KAFKA_VERSION" bash "$REPO/docker/services/kafka.sh" fetch >&2; then
    # it also fetches Spark's Kafka connector; the image only needs the broker's jars
    [[ -f "$broker_lib/.fetched-$KAFKA_VERSION" ]] || die "docker/services/kafka.sh fetch failed"
    log "WARNING: docker/services/kafka.sh fetch failed, but the broker's jars are there"
  fi
  [[ -f "$broker_lib/.fetched-$KAFKA_VERSION" ]] \
    || die "$broker_lib holds no Kafka $KAFKA_VERSION (another SPARKEOS_KAFKA_VERSION fetched there? rm -rf it)"
  fetch_jars "$tools_lib" "$STATE/kafka-tools" kafka-tools ".fetched-$KAFKA_VERSION" \
    "Apache Kafka tools $KAFKA_VERSION" <<EOF
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$KAFKA_VERSION</version>
      <exclusions><exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion></exclusions>
    </dependency>
EOF
}

build_kafka() {
  local ctx; ctx="$(new_context kafka)"
  link_tree "$SERVICES_DIR/kafka/lib" "$ctx/libs"
  rm -f "$ctx"/libs/.fetched-*
  ln "$STATE/kafka-tools/lib/kafka-tools-$KAFKA_VERSION.jar" "$ctx/libs/" 2>/dev/null \
    || cp -p "$STATE/kafka-tools/lib/kafka-tools-$KAFKA_VERSION.jar" "$ctx/libs/"
  docker_build kafka "$KAFKA_IMAGE" "$ctx" --build-arg "BASE=sparkeos/debian:$JAVA_SUITE"
}

fetch_artemis() {
  SPARKEOS_ARTEMIS_VERSION="$ARTEMIS_VERSION" bash "$REPO/docker/services/artemis.sh" fetch >&2
}

build_artemis() {
  local ctx home="$SERVICES_DIR/artemis/apache-artemis-$ARTEMIS_VERSION"
  [[ -x "$home/bin/artemis" ]] || die "no Artemis distribution in $home"
  ctx="$(new_context artemis)"
  link_tree "$home" "$ctx/apache-artemis"
  rm -f "$ctx/apache-artemis/.fetched"
  docker_build artemis "$ARTEMIS_IMAGE" "$ctx" --build-arg "BASE=sparkeos/debian:$JAVA_SUITE"
}

# ---------------------------------------------------------------- main

docker info >/dev/null 2>&1 || die "no Docker engine answers (start one: bash docker/engine.sh start)"
mkdir -p "$STATE" "$LOGS"
T0=$SECONDS

# debootstrap, needed if a base image is missing
need_suites=()
if wants postgres; then need_suites+=("$PG_SUITE"); fi
if wants kafka || wants artemis; then need_suites+=("$JAVA_SUITE"); fi
for suite in "${need_suites[@]}"; do
  if ! image_exists "sparkeos/debian:$suite" && ! command -v debootstrap >/dev/null; then
    apt_install debootstrap "$STATE/apt.log" "debootstrap"
  fi
done

# Two chains run side by side (each about a minute from scratch; seconds when cached):
#   postgres:  base $PG_SUITE -> postgres image
#   java:      fetch jars on the host, base bookworm -> kafka image -> artemis image (one
#              after the other: the second reuses the first's JRE layer)
# Their messages are tagged build.sh[postgres] / build.sh[java]; the long outputs
# (debootstrap, docker build) go to files in $LOGS.
chain_postgres() { build_postgres; }
chain_java() {
  if wants kafka; then fetch_kafka; fi
  if wants artemis; then fetch_artemis; fi
  build_base "$JAVA_SUITE"
  if wants kafka; then build_kafka; fi
  if wants artemis; then build_artemis; fi
}

# both chains on one base (SPARKEOS_POSTGRES_MAJOR=15): build it before they start
if wants postgres && [[ "$PG_SUITE" == "$JAVA_SUITE" ]] && { wants kafka || wants artemis; }; then
  build_base "$JAVA_SUITE"
fi

declare -A PIDS=()
if wants postgres; then
  (SCRIPT_NAME="build.sh[postgres]"; chain_postgres) &
  PIDS[postgres]=$!
fi
if wants kafka || wants artemis; then
  (SCRIPT_NAME="build.sh[java]"; chain_java) &
  PIDS[java]=$!
fi
failed=()
for chain in "${!PIDS[@]}"; do
  wait "${PIDS[$chain]}" || failed+=("$chain")
done
[[ ${#failed[@]} -eq 0 ]] || die "failed: ${failed[*]} (logs: $LOGS)"

log "done in $((SECONDS - T0)) s; for docker/compose.yaml:"
if wants postgres; then log "  export SPARKEOS_POSTGRES_IMAGE=$POSTGRES_IMAGE"; fi
if wants kafka; then log "  export SPARKEOS_KAFKA_IMAGE=$KAFKA_IMAGE"; fi
if wants artemis; then log "  export SPARKEOS_ARTEMIS_IMAGE=$ARTEMIS_IMAGE"; fi
if wants postgres; then echo "image postgres=$POSTGRES_IMAGE"; fi
if wants kafka; then echo "image kafka=$KAFKA_IMAGE"; fi
if wants artemis; then echo "image artemis=$ARTEMIS_IMAGE"; fi
