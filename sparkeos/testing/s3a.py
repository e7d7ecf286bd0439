"""Spark's own access to an S3-compatible store (Hadoop's S3A), for the tests, the demo
and the benchmarks of a source checkout: the jars and the session settings.

Spark keeps its checkpoint (offsets, commits, state) through Hadoop's file systems;
sparkeos writes its commit log, staging and output itself (``core.storage.stores.s3``). Both
must reach the same store: ``s3a_spark_conf`` points S3A at the endpoint sparkeos uses.
Credentials are left to S3A's default chain, which reads ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` from the environment as boto3 does: no secret in a setting.
"""

from __future__ import annotations

import os
import subprocess

from sparkeos.core.errors import ConfigurationError

JARS_ENV = "SPARKEOS_S3A_JARS"
_SCRIPT = os.path.join("docker", "services", "s3.sh")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def spark_s3a_jars() -> list[str]:
    """``$SPARKEOS_S3A_JARS`` (comma-separated), else ``bash docker/services/s3.sh
    spark-jars`` of this checkout (fetched from Maven Central once)."""
    configured = [j for j in os.environ.get(JARS_ENV, "").split(",") if j.strip()]
    if configured:
        return configured
    if not os.path.isfile(os.path.join(_ROOT, _SCRIPT)):
        raise ConfigurationError(
            "Hadoop's S3A jars were not found (not a sparkeos checkout)",
            fix=f"set ${JARS_ENV} to hadoop-aws and the AWS SDK jars, or start Spark with "
            "spark.jars.packages=org.apache.hadoop:hadoop-aws:<pyspark's Hadoop version>")
    out = subprocess.run(["bash", _SCRIPT, "spark-jars"], cwd=_ROOT, capture_output=True,
                         text=True, timeout=900)
    if out.returncode != 0 or not out.stdout.strip():
        raise ConfigurationError(f"{_SCRIPT} spark-jars failed: {out.stderr.strip()[-500:]}",
                                 fix="check that Maven Central is reachable (mvn)")
    return out.stdout.strip().splitlines()[-1].split(",")


def s3a_spark_conf(endpoint: str | None = None) -> dict[str, str]:
    """Session settings that give Spark S3A: on ``endpoint`` (default
    ``$AWS_ENDPOINT_URL_S3``, else ``$AWS_ENDPOINT_URL``; none: Amazon S3), addressed
    path-style (a local or self-hosted store has no DNS name per bucket)."""
    endpoint = (endpoint or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL"))
    conf = {"spark.jars": ",".join(spark_s3a_jars()),
            "spark.hadoop.fs.s3a.endpoint.region": os.environ.get("AWS_REGION", "us-east-1")}
    if endpoint:
        conf.update({"spark.hadoop.fs.s3a.endpoint": endpoint,
                     "spark.hadoop.fs.s3a.path.style.access": "true"})
    return conf


LOCAL_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "sparkeos", "AWS_SECRET_ACCESS_KEY": "sparkeos",
                     "AWS_REGION": "us-east-1"}
"""What the local store of docker/services/s3.sh is reached with (it takes any)."""


def start_local_store(bucket: str) -> str:
    """Start (or find) this checkout's local S3 server (``docker/services/s3.sh``), point
    this process and its children at it (``AWS_ENDPOINT_URL_S3``; the credentials it
    takes, unless set), make ``bucket``; its endpoint."""
    import re

    out = subprocess.run(["bash", _SCRIPT, "start"], cwd=_ROOT, capture_output=True,
                         text=True, timeout=600)
    found = re.search(r"s3=(\S+)", out.stdout)
    if out.returncode != 0 or not found:
        raise ConfigurationError(f"{_SCRIPT} start failed: {out.stderr.strip()[-800:]}",
                                 fix="see the script's log under .services/s3/")
    endpoint = found.group(1)
    for name, value in LOCAL_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
    make_bucket(endpoint, bucket)
    return endpoint


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` on ``endpoint`` unless this account has it already."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass
