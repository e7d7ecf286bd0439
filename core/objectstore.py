"""S3-compatible object stores as a ``Files``: write-once by conditional writes.

An object store has no rename and no directories, but it has the one thing the
protocol needs: a ``PUT`` with ``If-None-Match: *`` creates a key only if it is absent,
and of two writers racing for one key exactly one wins (the other gets ``412
Precondition Failed``). Amazon S3 has it since August 2024; so do MinIO, Cloudflare R2,
Ceph RGW and the local server of ``docker/services/s3.sh``. On it:

* **write-once creation** (``create_new``, ``upload_new``): a conditional ``PUT``;
* **exclusive claim** (``claim_dir``): a conditional ``PUT`` of ``<dir>/.claim``;
* **publish without overwrite** (``publish``): the staged object is read and written
  under its final key with a conditional ``PUT`` (never a plain copy: a server-side
  copy's precondition is not honoured everywhere, and moto overwrites). A ``PUT`` is
  atomic: a reader sees the whole object or none.
* **large objects** (above ``multipart_threshold``, 64 MiB): a multipart upload whose
  completion is conditional (``If-None-Match: *`` on ``CompleteMultipartUpload``),
  atomic as a ``PUT``. A staged part file is uploaded in parts from the task's disk; a
  publish copies the staged object's ranges inside the store (``UploadPartCopy``: no
  round trip through the committing process), and only the completion creates the
  key. A single ``PUT`` takes 5 GiB at most; an upload that fails is aborted, its
  parts deleted.

**A write knows its own object.** A reply can be lost after the store applied the
``PUT`` (a reset connection, a timeout); botocore then sends it again, and the retry
meets the object the first try made: ``412``. Every conditional ``PUT`` therefore
carries a token of its own (object metadata ``x-amz-meta-sparkeos-writer``), and a
``412`` is settled by reading the object's token back: this write's token means the
write succeeded, another token means another writer won the race. A transient failure
that outlasts botocore's retries (five tries) is retried here with the same token.

A store that accepts the header but ignores it would let two claimers both win: the
first write-once call of a process on a bucket probes it (a key written twice, the
second time conditionally, must be refused) and refuses a store that fails the probe,
before anything of the caller is written. The probe is written beside what is being
written (beside a directory being claimed, not in it), and each probe removes the
probes older than an hour that a process died before removing.

Credentials come from boto3's chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``,
``AWS_PROFILE``, instance roles): they are never part of this object, so never pickled
into tasks or printed. The endpoint (``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``;
else the active Spark session's ``spark.hadoop.fs.s3a.endpoint``; unset: Amazon S3) and
region are resolved where the ``S3Files`` is made, on the driver, and travel with it to
the tasks.
"""

from __future__ import annotations

import os
import posixpath
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError, RetriableError
from .files import S3_SCHEMES, Files

ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
CONFLICT_RETRIES = 5
"""S3 answers ``409 ConditionalRequestConflict`` while another conditional write to the
key is in flight; it asks to retry (then the loser gets its 412)."""
WRITER_META = "sparkeos-writer"
"""The object metadata key of a conditional write's token (S3 returns it lowercased)."""
BOTO_ATTEMPTS = 5
"""Tries botocore makes of one request (its standard mode: 3) before it gives up."""
TRANSIENT_RETRIES = 3
"""Conditional writes retried here with their token after botocore gave up on a
transient failure (a reset connection, 500, 503 SlowDown)."""
PROBE_PREFIX = ".sparkeos-probe-"
PROBE_STALE_S = 3600.0
"""A probe older than this was left by a process that died between its writes."""
MIB = 1024 * 1024
MIN_PART = 5 * MIB
MAX_PARTS = 10_000
SPOOL_IN_MEMORY = 64 * MIB
"""``publish`` holds a staged object up to this size in memory, larger ones on disk."""

_clients: dict[tuple[str | None, str], Any] = {}
_verified: set[tuple[str | None, str]] = set()
_lock = threading.Lock()


@dataclass(frozen=True)
class S3Files(Files):
    """One bucket of an S3-compatible store; paths are ``/key/prefix`` inside it."""

    scheme: str
    bucket: str
    endpoint: str | None = None
    region: str = "us-east-1"
    page_size: int = 1000
    """Keys per listing page and per batch delete (S3's most: 1000)."""
    multipart_threshold: int = 64 * MIB
    """Objects above this size are written by a multipart upload."""
    part_size: int = 64 * MIB
    """The parts' size (S3: 5 MiB at least, 10,000 parts at most; raised to fit)."""

    @classmethod
    def from_environment(cls, scheme: str, bucket: str) -> S3Files:
        """The endpoint and region as boto3 reads them, else as Spark's S3A has them
        (``spark.hadoop.fs.s3a.[bucket.<bucket>.]endpoint``, of the active session)."""
        endpoint = next((os.environ[e] for e in ENDPOINT_ENVS if os.environ.get(e)), None)
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if endpoint is None:
            endpoint = (_s3a_setting(f"bucket.{bucket}.endpoint")
                        or _s3a_setting("endpoint"))
            if endpoint and "://" not in endpoint:
                secure = (_s3a_setting("connection.ssl.enabled") or "true") == "true"
                endpoint = f"{'https' if secure else 'http'}://{endpoint}"
            region = region or _s3a_setting("endpoint.region")
        return cls(scheme, bucket, endpoint.rstrip("/") if endpoint else None,
                   region or "us-east-1")

    def uri(self, path: str) -> str:
        return f"{self.scheme}://{self.bucket}{path}"

    @property
    def atomic_create(self) -> bool:
        return True

    def where(self) -> str:
        return f"{self.scheme}://{self.bucket} at {self.endpoint or 'Amazon S3'}"

    # -- the client ----------------------------------------------------------------------------
    def _client(self) -> Any:
        key = (self.endpoint, self.region)
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = _new_client(self.endpoint, self.region)
        return client

    def _call(self, operation: str, path: str, **params: Any) -> Any:
        """One S3 call on ``path``'s key, its failures in this module's terms."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            return getattr(self._client(), operation)(Bucket=self.bucket, **params)
        except ClientError as exc:
            raise _translate(exc, self, path, operation) from None
        except NoCredentialsError:
            raise ConfigurationError(
                f"no credentials for {self.where()}",
                fix="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in "
                "the driver's and the executors' environment",
            ) from None
        except BotoCoreError as exc:
            raise RetriableError(
                f"{self.where()} cannot be reached ({operation} {self.uri(path)}): {exc}",
                fix="start the store or check its endpoint (AWS_ENDPOINT_URL_S3)",
            ) from None

    def check_conditional_writes(self, near: str) -> None:
        """Refuse a store that ignores ``If-None-Match: *`` (once per process and bucket):
        a probe key beside ``near`` is written, then written again conditionally."""
        if (self.endpoint, self.bucket) in _verified:
            return
        beside = posixpath.dirname(near.rstrip("/")) or "/"
        probe = _key(posixpath.join(beside, f"{PROBE_PREFIX}{int(time.time() * 1000)}-"
                                            f"{uuid.uuid4().hex}"))
        self._call("put_object", probe, Key=probe, Body=b"probe")
        try:
            try:
                self._call("put_object", probe, Key=probe, Body=b"again", IfNoneMatch="*")
            except FileExistsError:
                with _lock:
                    _verified.add((self.endpoint, self.bucket))
                return
            except (OSError, ConfigurationError):
                raise _no_conditional_writes(self, "refused the conditional write") from None
            raise _no_conditional_writes(self, "overwrote an existing key")
        finally:
            try:
                self._call("delete_object", probe, Key=probe)
            except (OSError, RetriableError):
                pass  # the next probe here removes it, an hour on
            self._delete_stale_probes(beside)

    def _delete_stale_probes(self, beside: str) -> None:
        """Probes a process left when it died between its writes (best effort)."""
        prefix = posixpath.join(_dir_key(beside), PROBE_PREFIX)
        try:
            for key in self._keys(prefix):
                written = key[len(prefix):].split("-", 1)[0]
                if written.isdigit() and int(written) / 1000 < time.time() - PROBE_STALE_S:
                    self._call("delete_object", key, Key=key)
        except (OSError, RetriableError):
            pass

    def _written_by(self, path: str, token: str) -> bool:
        """Whether the object at ``path`` is the one the write with ``token`` made."""
        try:
            head = self._call("head_object", path, Key=_key(path))
        except FileNotFoundError:
            return False
        return bool(head.get("Metadata", {}).get(WRITER_META) == token)

    def _put_new(self, path: str, body: Any) -> None:
        """Create ``path`` unless it exists (``FileExistsError``: another writer's)."""
        self.check_conditional_writes(path)
        token = uuid.uuid4().hex

        def send() -> None:
            if hasattr(body, "seek"):
                body.seek(0)
            self._call("put_object", path, Key=_key(path), Body=body, IfNoneMatch="*",
                       Metadata={WRITER_META: token})

        self._create_once(path, token, send)

    def _create_once(self, path: str, token: str, send: Any) -> None:
        """Run ``send`` (a conditional write of ``path`` carrying ``token``) until the
        store answered it: a 412 or a vanished upload settled by the token read back,
        409 conflicts and transient failures retried as the same writer."""
        transient = 0
        for attempt in range(CONFLICT_RETRIES + TRANSIENT_RETRIES):
            try:
                send()
                return
            except FileExistsError:
                if self._written_by(path, token):
                    return  # a retry of this write met the object its lost reply made
                raise
            except FileNotFoundError:
                # NoSuchUpload: completed by a try whose reply was lost, or removed.
                if self._written_by(path, token):
                    return
                raise RetriableError(
                    f"{self.uri(path)}: the store lost the multipart upload before its "
                    "completion (a lifecycle rule aborting incomplete uploads?)",
                    fix="retried with the batch; give incomplete uploads a day or more "
                    "before a lifecycle rule aborts them") from None
            except _Conflict:
                pass
            except RetriableError:
                transient += 1
                if transient > TRANSIENT_RETRIES:
                    raise
            time.sleep(0.05 * 2**min(attempt, 5))
        raise RetriableError(
            f"{self.uri(path)}: the store answered 'conflict' to {CONFLICT_RETRIES} "
            "conditional writes in a row", fix="retried with the batch")

    def _keys(self, prefix: str) -> Iterator[str]:
        """Every key under ``prefix`` (a bounded prefix listing, never the bucket)."""
        token: dict[str, str] = {}
        while True:
            page = self._call("list_objects_v2", prefix, Prefix=prefix,
                              MaxKeys=self.page_size, **token)
            yield from (o["Key"] for o in page.get("Contents", ()))
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}

    # -- Files ---------------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        try:
            self._call("head_object", path, Key=_key(path))
            return True
        except FileNotFoundError:
            return self.isdir(path)

    def isdir(self, path: str) -> bool:
        prefix = _dir_key(path)
        page = self._call("list_objects_v2", path, Prefix=prefix, MaxKeys=1)
        return bool(page.get("KeyCount") or page.get("Contents"))

    def makedirs(self, path: str) -> None:
        """Nothing: a prefix exists once a key under it does."""

    def claim_dir(self, path: str) -> bool:
        self.check_conditional_writes(path)  # the probe beside the directory, not in it
        try:
            self._put_new(posixpath.join(path, ".claim"), b"")
        except FileExistsError:
            return False
        return True

    def create_new(self, path: str, data: bytes) -> None:
        self._put_new(path, data)

    def upload_new(self, local_file: str, path: str) -> None:
        size = os.path.getsize(local_file)
        with open(local_file, "rb") as body:
            if size > self.multipart_threshold:
                def upload(number: int, start: int, end: int, **upload: Any) -> str:
                    body.seek(start)
                    answer = self._call("upload_part", path, Body=body.read(end - start),
                                        PartNumber=number, **upload)
                    return str(answer["ETag"])

                self._multipart_new(path, size, upload)
            else:
                self._put_new(path, body)

    def publish(self, staged: str, final: str) -> None:
        size = int(self._call("head_object", staged, Key=_key(staged))["ContentLength"])
        if size > self.multipart_threshold:
            source = {"Bucket": self.bucket, "Key": _key(staged)}

            def copy(number: int, start: int, end: int, **upload: Any) -> str:
                answer = self._call("upload_part_copy", final, CopySource=source,
                                    CopySourceRange=f"bytes={start}-{end - 1}",
                                    PartNumber=number, **upload)
                return str(answer["CopyPartResult"]["ETag"])

            self._multipart_new(final, size, copy)
            return
        answer = self._call("get_object", staged, Key=_key(staged))
        with tempfile.SpooledTemporaryFile(SPOOL_IN_MEMORY) as body:
            for chunk in answer["Body"].iter_chunks(1024 * 1024):
                body.write(chunk)
            body.seek(0)
            self._put_new(final, body)

    def _multipart_new(self, path: str, size: int, send_part: Any) -> None:
        """Create ``path`` (``size`` bytes) from parts ``send_part(number, start, end,
        Key=, UploadId=)`` sends; the completion is conditional and carries the write's
        token, as ``_put_new``'s ``PUT``."""
        self.check_conditional_writes(path)
        token, key = uuid.uuid4().hex, _key(path)
        upload_id = self._call("create_multipart_upload", path, Key=key,
                               Metadata={WRITER_META: token})["UploadId"]
        try:
            part = max(self.part_size, MIN_PART, -(-size // MAX_PARTS))
            parts = [{"PartNumber": number, "ETag": send_part(
                number, start, min(start + part, size), Key=key, UploadId=upload_id)}
                for number, start in enumerate(range(0, size, part), start=1)]
            self._create_once(path, token, lambda: self._call(
                "complete_multipart_upload", path, Key=key, UploadId=upload_id,
                MultipartUpload={"Parts": parts}, IfNoneMatch="*"))
        except BaseException:
            try:
                self._call("abort_multipart_upload", path, Key=key, UploadId=upload_id)
            except Exception:
                pass  # completed after all, or the store's lifecycle rule removes it
            raise

    def overwrite(self, path: str, data: bytes) -> None:
        # One PUT replaces a key atomically, and sending it again is harmless.
        self._call("put_object", path, Key=_key(path), Body=data)

    def replace(self, src: str, dst: str) -> None:
        # A PUT replaces a key atomically; the source goes afterwards.
        data = self.read(src)
        self._call("put_object", dst, Key=_key(dst), Body=data)
        self._call("delete_object", src, Key=_key(src))

    def listdir(self, path: str) -> list[str]:
        prefix, names = _dir_key(path), []
        token: dict[str, str] = {}
        while True:
            page = self._call("list_objects_v2", path, Prefix=prefix, Delimiter="/",
                              MaxKeys=self.page_size, **token)
            names += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", ())]
            names += [o["Key"][len(prefix):] for o in page.get("Contents", ())]
            if not page.get("IsTruncated"):
                return [n for n in names if n]
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def read(self, path: str) -> bytes:
        answer = self._call("get_object", path, Key=_key(path))
        data: bytes = answer["Body"].read()
        return data

    def delete(self, path: str) -> None:
        self._call("delete_object", path, Key=_key(path))
        batch: list[str] = []
        for key in self._keys(_dir_key(path)):
            batch.append(key)
            if len(batch) >= min(self.page_size, 1000):  # DeleteObjects: 1000 at most
                self._delete_keys(path, batch)
                batch = []
        if batch:
            self._delete_keys(path, batch)

    def _delete_keys(self, path: str, keys: list[str]) -> None:
        answer = self._call("delete_objects", path,
                            Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True})
        if answer.get("Errors"):
            first = answer["Errors"][0]
            raise OSError(f"could not delete {len(answer['Errors'])} objects under "
                          f"{self.uri(path)}: {first.get('Key')}: {first.get('Message')}")


def _s3a_setting(name: str) -> str | None:
    """``spark.hadoop.fs.s3a.<name>`` of this process's active Spark session, if any."""
    try:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
        value = session.conf.get(f"spark.hadoop.fs.s3a.{name}", None) if session else None
    except Exception:  # no pyspark, no session, or one that cannot answer
        return None
    return str(value) if value else None


class _Conflict(Exception):
    """409 ConditionalRequestConflict: another conditional write to the key is in flight."""


def _key(path: str) -> str:
    return posixpath.normpath(path).lstrip("/")


def _dir_key(path: str) -> str:
    key = _key(path)
    return "" if key in ("", ".") else f"{key}/"


def _new_client(endpoint: str | None, region: str) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise ConfigurationError(
            "object stores need boto3, which is not installed",
            fix="pip install 'sparkeos[s3]' on the driver and the executors",
        ) from None
    # A custom endpoint (a local server, MinIO, Ceph) rarely has a DNS name per bucket.
    style = "path" if endpoint else "auto"
    # Five tries (botocore's standard mode makes three): a lost reply, a reset or a
    # SlowDown each spend one, and a bad network day brings them in runs.
    config = Config(s3={"addressing_style": style},
                    retries={"mode": "standard", "max_attempts": BOTO_ATTEMPTS},
                    connect_timeout=10, read_timeout=60)
    return boto3.client("s3", endpoint_url=endpoint, region_name=region, config=config)


def _translate(exc: Any, files: S3Files, path: str, operation: str) -> Exception:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    where = files.uri(path)
    if status == 412 or code == "PreconditionFailed":
        return FileExistsError(where)
    if status == 409 and code == "ConditionalRequestConflict":
        return _Conflict(where)
    if code == "NoSuchBucket":
        return ConfigurationError(f"bucket {files.bucket} does not exist ({files.where()})",
                                  fix=f"create the bucket {files.bucket}, or check the URI")
    if status == 404 or code in ("NoSuchKey", "NotFound", "404"):
        return FileNotFoundError(where)
    if status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId",
                                        "SignatureDoesNotMatch"):
        return ConfigurationError(
            f"{files.where()} refused {operation} on {where}: {code}",
            fix="give the credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE) read, write, list "
            "and delete rights on the bucket's prefix")
    if status is not None and (status >= 500 or status == 429):
        return RetriableError(f"{files.where()} answered {status} {code} to {operation} "
                              f"on {where}", fix="retried with the batch")
    return OSError(f"{operation} {where}: {status} {code}: {error.get('Message', '')}")


def _no_conditional_writes(files: S3Files, what: str) -> ConfigurationError:
    return ConfigurationError(
        f"{files.where()} does not honour conditional writes: a PUT with "
        f"'If-None-Match: *' on an existing key {what}. Write-once records, exclusive "
        "claims and publishing without overwrite all rest on it; without it two "
        "committers could both win",
        fix="use a store with conditional writes (Amazon S3, MinIO, Cloudflare R2, Ceph "
        "RGW of 2024 or later), or put the checkpoint and the output on HDFS or a shared "
        "POSIX path",
    )


__all__ = ["S3_SCHEMES", "S3Files"]
