"""A class-data archive for Spark's JVM: local Spark sessions start in about half the time.

A test run starts Spark a few hundred times (every job that is killed and restarted is
a new process), and most of each start is the JVM loading and verifying Spark's ~20,000
classes. Java's dynamic class-data sharing (``-XX:ArchiveClassesAtExit`` once,
``-XX:SharedArchiveFile`` after) maps them from a file instead: measured here, a
session's ``getOrCreate`` 8.3 s -> 4.3 s and its first job 4.2 s -> 2.0 s.

    python -m sparkeos.testing.cds [DIRECTORY]   # make the archive if missing; print it

The archive belongs to one JDK and one set of Spark jars (its name says which); an
archive that does not fit is ignored by the JVM (it starts as usual). Sessions made by
``core.streaming.spark.local_session`` / ``connect_session`` use the archive named by
``$SPARKEOS_SPARK_CDS`` when it exists.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile

from sparkeos.core.streaming.spark import CDS_ENV
from sparkeos.testing import sparkhome
from sparkeos.testing.once import made_once


def archive_name() -> str:
    """``spark-<digest>.jsa``, the digest of the JDK, of Spark's home (the archive
    holds the class path's names: ``sparkeos.testing.sparkhome``) and of its jars."""
    import pyspark

    home = sparkhome.spark_home()
    jars = os.path.join(home, "jars")
    try:
        listing = sorted(os.listdir(jars))
    except OSError:
        listing = []
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    digest = hashlib.sha256("\n".join([java, pyspark.__version__, home, *listing]).encode())
    return f"spark-{digest.hexdigest()[:16]}.jsa"


def ensure_archive(directory: str) -> str | None:
    """The archive for this JDK and Spark in ``directory``, made first if missing (about
    15 s, once); None if it cannot be made (Spark then starts as usual)."""
    return made_once(os.path.join(directory, archive_name()), _make)


def _make(path: str) -> str | None:
    directory = os.path.dirname(path)
    handle, temp = tempfile.mkstemp(prefix=".spark-cds-", suffix=".jsa", dir=directory)
    os.close(handle)
    os.unlink(temp)  # the JVM creates it at exit
    # An archive inherited in the options (the test session's SPARK_SUBMIT_OPTS) stops a
    # JVM that dumps one from starting.
    env = {key: value for key, value in os.environ.items()
           if key not in (CDS_ENV, "SPARK_SUBMIT_OPTS")}
    result = subprocess.run([sys.executable, "-m", "sparkeos.testing.cds", "--dump", temp],
                            capture_output=True, text=True, env=env, timeout=600)
    if result.returncode != 0 or not os.path.exists(temp):
        return None
    os.replace(temp, path)
    return path


def _dump(target: str) -> int:
    """Start Spark with ``-XX:ArchiveClassesAtExit``, run what the tests run (a batch
    job, ``mapInArrow``, a streaming query with ``foreachBatch``), stop the JVM."""
    import json

    from sparkeos.core.streaming.spark import local_session
    from sparkeos.testing.job import SHORT_JOB_CONF

    options = f"{SHORT_JOB_CONF['spark.driver.extraJavaOptions']} " \
              f"-XX:ArchiveClassesAtExit={target}"
    spark = local_session("sparkeos-cds", "local[2]",
                          {**SHORT_JOB_CONF, "spark.driver.extraJavaOptions": options})
    spark.range(64).repartition(2).selectExpr("sum(id)").collect()
    spark.range(64).repartition(2).mapInArrow(lambda it: it, "id long").collect()
    with tempfile.TemporaryDirectory() as work:
        with open(os.path.join(work, "in.json"), "w") as fh:
            fh.write(json.dumps({"id": 1, "payload": "x"}) + "\n")
        query = (spark.readStream.schema("id long, payload string").json(work)
                 .writeStream.foreachBatch(lambda df, _batch: df.collect())
                 .option("checkpointLocation", os.path.join(work, "ckpt"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    gateway = spark.sparkContext._gateway
    spark.stop()
    process = getattr(gateway, "proc", None)
    gateway.shutdown()
    if process is not None:  # the JVM writes the archive as it exits
        process.stdin.close()
        process.wait(timeout=120)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--dump"]:
        return _dump(argv[1])
    directory = argv[0] if argv else os.path.join(sys.prefix, "spark-cds")
    path = ensure_archive(directory)
    print(path or "no archive (Spark starts without one)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
