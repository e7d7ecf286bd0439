#!/usr/bin/env bash
# Fetch single JVM jars from Maven Central into $SPARKEOS_SERVICES_DIR/jars (once) and
# print their paths, comma-separated (ready for spark.jars).
#
#   bash docker/services/jars.sh org.postgresql:postgresql:42.7.5 [GROUP:ARTIFACT:VERSION ...]
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
DIR=${SPARKEOS_SERVICES_DIR:-$REPO/.services}/jars
mkdir -p "$DIR"
# Two sessions may fetch at once (./run test runs two pytest workers): one at a time.
exec 9>>"$DIR/.lock"
flock -w 600 9 || { echo "jars.sh: could not lock $DIR/.lock within 600 s" >&2; exit 1; }
paths=()
for coordinate in "$@"; do
  IFS=: read -r group artifact version <<<"$coordinate"
  jar="$DIR/$artifact-$version.jar"
  if [ ! -s "$jar" ]; then
    mvn -q -B dependency:copy "-Dartifact=$coordinate" "-DoutputDirectory=$DIR" >"$DIR/mvn.log" 2>&1 ||
      { cat "$DIR/mvn.log" >&2; echo "jars.sh: could not fetch $coordinate from Maven Central" >&2; exit 1; }
  fi
  paths+=("$jar")
done
(IFS=,; echo "${paths[*]}")
