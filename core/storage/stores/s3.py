"""S3-compatible object stores (Amazon S3, MinIO, R2, Ceph RGW) as a ``Files``.

The conditional create is a ``PUT`` with ``If-None-Match: *`` (Amazon S3 has it since
August 2024; so do MinIO, Cloudflare R2, Ceph RGW and the local server of
``docker/services/s3.sh``); the writer token is the object metadata
``x-amz-meta-sparkeos-writer``. What every object store shares (tokens, the probe,
retries as the same writer) is ``core.storage.stores.writeonce``; here are S3's calls:

* a small publish reads the staged object and writes it with a conditional ``PUT``
  (never a plain copy: a server-side copy's precondition is not honoured everywhere,
  and moto overwrites);
* **large objects** (above ``multipart_threshold``, 64 MiB): a multipart upload whose
  completion is conditional (``If-None-Match: *`` on ``CompleteMultipartUpload``),
  atomic as a ``PUT``. A staged part file is uploaded in parts from the task's disk; a
  publish copies the staged object's ranges inside the store (``UploadPartCopy``: no
  round trip through the committing process), and only the completion creates the
  key. A single ``PUT`` takes 5 GiB at most; an upload that fails is aborted, its
  parts deleted. botocore makes five tries of each request.

Credentials come from boto3's chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``,
``AWS_PROFILE``, instance roles): they are never part of this object, so never pickled
into tasks or printed; a process keeps one client per endpoint, region and credentials
(a change of the ``AWS_*`` environment gets a client of its own). The endpoint
(``AWS_ENDPOINT_URL_S3``, else ``AWS_ENDPOINT_URL``; else S3A's ``endpoint`` for the
bucket, as Hadoop resolves it: ``spark.hadoop.fs.s3a.bucket.<bucket>.endpoint``, else
``spark.hadoop.fs.s3a.endpoint``, found as ``core.storage.stores.settings`` finds them: the
session, the settings a format carries, a task's local properties; unset: Amazon S3)
and region are resolved where the ``S3Files`` is made, on the driver, and travel with
it to the tasks, with the name of the setting the endpoint came from: a store that
cannot be reached says it, and how to give the setting.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from sparkeos.core.errors import ConfigurationError, RetriableError

from .settings import S3A_PREFIX, carry_fix, s3a_setting
from .writeonce import (
    MIB,
    ObjectStoreFiles,
    StoreConflict,
    UploadLost,
    dir_key,
    environment_identity,
    key_of,
)

S3_SCHEMES = ("s3", "s3a", "s3n")
ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
WRITER_META = "sparkeos-writer"
"""The object metadata key of a conditional write's token (S3 returns it lowercased)."""
BOTO_ATTEMPTS = 5
"""Tries botocore makes of one request (its standard mode: 3) before it gives up."""
MIN_PART = 5 * MIB
MAX_PARTS = 10_000
CREDENTIAL_ENVS = ("AWS_",)
"""The environment boto3's credential chain reads (keys, profile, role, files)."""


@dataclass(frozen=True)
class S3Files(ObjectStoreFiles):
    """One bucket of an S3-compatible store; paths are ``/key/prefix`` inside it."""

    scheme: str
    bucket: str
    endpoint: str | None = None
    region: str = "us-east-1"
    page_size: int = 1000
    """Keys per listing page and per batch delete (S3's most: 1000)."""
    multipart_threshold: int = 64 * MIB
    part_size: int = 64 * MIB
    """The parts' size (S3: 5 MiB at least, 10,000 parts at most; raised to fit)."""
    endpoint_from: str = field(default="", compare=False)
    """The setting ``endpoint`` came from (``AWS_ENDPOINT_URL_S3``, ``spark.hadoop.fs.
    s3a.endpoint (from ...)``); empty: none, Amazon S3's own."""

    @classmethod
    def from_environment(cls, scheme: str, bucket: str) -> S3Files:
        """The endpoint and region as boto3 reads them, else as Spark's S3A has them for
        this bucket (``core.storage.stores.settings.s3a_setting``: the bucket's own
        ``fs.s3a.bucket.<bucket>.<option>`` over ``fs.s3a.<option>``)."""
        source = next((e for e in ENDPOINT_ENVS if os.environ.get(e)), "")
        endpoint = os.environ[source] if source else None
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if endpoint is None:
            found = s3a_setting(bucket, "endpoint")
            if found is not None:
                endpoint, source = found.value, found.describe()
                if "://" not in endpoint:
                    ssl = s3a_setting(bucket, "connection.ssl.enabled")
                    secure = ssl is None or ssl.value.strip().lower() != "false"
                    endpoint = f"{'https' if secure else 'http'}://{endpoint}"
            found_region = s3a_setting(bucket, "endpoint.region")
            region = region or (found_region.value if found_region else None)
        return cls(scheme, bucket, endpoint.rstrip("/") if endpoint else None,
                   region or "us-east-1", endpoint_from=source)

    def uri(self, path: str) -> str:
        return f"{self.scheme}://{self.bucket}{path}"

    def where(self) -> str:
        return f"{self.scheme}://{self.bucket} at {self.endpoint or 'Amazon S3'}"

    def credentials_identity(self) -> str:
        return environment_identity(CREDENTIAL_ENVS)

    def endpoint_origin(self) -> str:
        """Where the endpoint came from, for messages."""
        if self.endpoint_from:
            return f"the endpoint {self.endpoint} came from {self.endpoint_from}"
        names = ", ".join((*ENDPOINT_ENVS, f"spark.hadoop.{S3A_PREFIX}endpoint",
                           f"spark.hadoop.{S3A_PREFIX}bucket.{self.bucket}.endpoint"))
        return (f"no endpoint setting reached this process ({names}), so it used Amazon "
                "S3's own")

    def endpoint_fix(self) -> str:
        """How to point this process at the store."""
        return ("start the store, or point sparkeos at it: "
                + carry_fix([f"{S3A_PREFIX}endpoint",
                             f"{S3A_PREFIX}bucket.{self.bucket}.endpoint"])
                + f"; or set {ENDPOINT_ENVS[0]} in the driver's and the executors' "
                "environment (it comes first)")

    # -- the client ----------------------------------------------------------------------------
    def _client(self) -> Any:
        key = (self.endpoint, self.region, self.credentials_identity())
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
                f"no credentials for {self.where()} ({self.endpoint_origin()})",
                fix="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in "
                "the driver's and the executors' environment; if the store is not Amazon "
                "S3: " + self.endpoint_fix(),
            ) from None
        except BotoCoreError as exc:
            raise RetriableError(
                f"{self.where()} cannot be reached ({operation} {self.uri(path)}): {exc}; "
                f"{self.endpoint_origin()}",
                fix=self.endpoint_fix(),
            ) from None

    # -- the primitives of a write-once store -----------------------------------------------
    def _put_if_absent(self, path: str, body: bytes | IO[bytes], token: str) -> None:
        self._call("put_object", path, Key=key_of(path), Body=body, IfNoneMatch="*",
                   Metadata={WRITER_META: token})

    def _put(self, path: str, data: bytes) -> None:
        self._call("put_object", path, Key=key_of(path), Body=data)

    def _writer_of(self, path: str) -> str | None:
        try:
            head = self._call("head_object", path, Key=key_of(path))
        except FileNotFoundError:
            return None
        token = head.get("Metadata", {}).get(WRITER_META)
        return str(token) if token else None

    def _size(self, path: str) -> int:
        return int(self._call("head_object", path, Key=key_of(path))["ContentLength"])

    def _get(self, path: str) -> bytes:
        data: bytes = self._call("get_object", path, Key=key_of(path))["Body"].read()
        return data

    def _get_into(self, path: str, sink: IO[bytes]) -> None:
        answer = self._call("get_object", path, Key=key_of(path))
        for chunk in answer["Body"].iter_chunks(1024 * 1024):
            sink.write(chunk)

    def _keys(self, prefix: str) -> Iterator[str]:
        token: dict[str, str] = {}
        while True:
            page = self._call("list_objects_v2", prefix, Prefix=prefix,
                              MaxKeys=self.page_size, **token)
            yield from (o["Key"] for o in page.get("Contents", ()))
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def _names(self, prefix: str) -> list[str]:
        names: list[str] = []
        token: dict[str, str] = {}
        while True:
            page = self._call("list_objects_v2", "/" + prefix, Prefix=prefix, Delimiter="/",
                              MaxKeys=self.page_size, **token)
            names += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", ())]
            names += [o["Key"][len(prefix):] for o in page.get("Contents", ())]
            if not page.get("IsTruncated"):
                return [n for n in names if n]
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def _delete_object(self, path: str) -> None:
        self._call("delete_object", path, Key=key_of(path))

    def _delete_keys(self, path: str, keys: list[str]) -> None:
        for start in range(0, len(keys), min(self.page_size, 1000)):  # 1000 at most
            chunk = keys[start:start + min(self.page_size, 1000)]
            answer = self._call("delete_objects", path,
                                Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True})
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise OSError(f"could not delete {len(answer['Errors'])} objects under "
                              f"{self.uri(path)}: {first.get('Key')}: {first.get('Message')}")

    def _upload_if_absent(self, local_file: str, path: str, size: int, token: str) -> None:
        with open(local_file, "rb") as body:
            if size <= self.multipart_threshold:
                self._put_if_absent(path, body, token)
                return

            def upload(number: int, start: int, end: int, **upload: Any) -> str:
                body.seek(start)
                answer = self._call("upload_part", path, Body=body.read(end - start),
                                    PartNumber=number, **upload)
                return str(answer["ETag"])

            self._multipart_if_absent(path, size, token, upload)

    def _copy_if_absent(self, staged: str, final: str, size: int, token: str) -> None:
        if size <= self.multipart_threshold:
            super()._copy_if_absent(staged, final, size, token)
            return
        source = {"Bucket": self.bucket, "Key": key_of(staged)}

        def copy(number: int, start: int, end: int, **upload: Any) -> str:
            answer = self._call("upload_part_copy", final, CopySource=source,
                                CopySourceRange=f"bytes={start}-{end - 1}",
                                PartNumber=number, **upload)
            return str(answer["CopyPartResult"]["ETag"])

        self._multipart_if_absent(final, size, token, copy)

    def _multipart_if_absent(self, path: str, size: int, token: str,
                             send_part: Callable[..., str]) -> None:
        """Create ``path`` (``size`` bytes) from parts ``send_part(number, start, end,
        Key=, UploadId=)`` sends; the completion is conditional and carries ``token``.
        Each part is sent once here (botocore retries each request); the completion is
        retried as the same writer by ``_create_once``."""
        key = key_of(path)
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

    def isdir(self, path: str) -> bool:
        page = self._call("list_objects_v2", path, Prefix=dir_key(path), MaxKeys=1)
        return bool(page.get("KeyCount") or page.get("Contents"))


_clients: dict[tuple[str | None, str, str], Any] = {}
_loader: Any = None
_lock = threading.Lock()
"""Guards ``_clients`` and ``_loader``."""


def _new_client(endpoint: str | None, region: str) -> Any:
    try:
        import boto3.session
        import botocore.session
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
                    retries={"mode": "standard", "total_max_attempts": BOTO_ATTEMPTS},
                    connect_timeout=10, read_timeout=60)
    # A session of its own, which reads the credentials of the environment now (boto3's
    # default session keeps those it resolved first for the life of the process), with
    # botocore's data loader shared (the S3 model is parsed once per process).
    global _loader
    core = botocore.session.get_session()
    if _loader is None:
        _loader = core.get_component("data_loader")
    else:
        core.register_component("data_loader", _loader)
    return boto3.session.Session(botocore_session=core).client(
        "s3", endpoint_url=endpoint, region_name=region, config=config)


def _translate(exc: Any, files: S3Files, path: str, operation: str) -> Exception:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    where = files.uri(path)
    if status == 412 or code == "PreconditionFailed":
        return FileExistsError(where)
    if status == 409 and code == "ConditionalRequestConflict":
        return StoreConflict(where)
    if code == "NoSuchBucket":
        return ConfigurationError(
            f"bucket {files.bucket} does not exist ({files.where()}; "
            f"{files.endpoint_origin()})",
            fix=f"create the bucket {files.bucket}, or check the URI and the endpoint")
    if code == "NoSuchUpload":
        return UploadLost(where)
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


__all__ = ["S3_SCHEMES", "S3Files"]
