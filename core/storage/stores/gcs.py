"""Google Cloud Storage as a ``Files``: write-once by ``ifGenerationMatch=0``.

A create with the precondition ``ifGenerationMatch=0`` succeeds only if no live object
has the name; of two racing writers one gets ``412 Precondition Failed``. The writer
token is the object's custom metadata ``sparkeos-writer`` (``core.storage.stores.writeonce``
settles a 412 with it). Objects above 8 MiB go up as one resumable upload, in chunks,
its precondition checked when it is finalized: a large part file is never a second
object. A publish is a ``rewrite`` inside the store with ``ifGenerationMatch=0`` on the
destination (no round trip through the committing process), where the probe found the
store honours it; otherwise (fake-gcs-server ignores it) the staged object is streamed
through the process to a conditional create.

Credentials come from Google's Application Default Credentials (``GOOGLE_APPLICATION_
CREDENTIALS``, the metadata server, ``gcloud auth application-default login``): never
part of this object (a process keeps one client per endpoint and ``GOOGLE_*``
environment). The endpoint (``STORAGE_EMULATOR_HOST``, the variable Google's clients
read for an emulator, else ``spark.hadoop.fs.gs.storage.root.url`` as
``core.storage.stores.settings`` finds it; unset: Google's) is resolved on the driver and
travels with the object to the tasks, with the name of the setting it came from. The
GCS connector has no per-bucket settings. With an emulator endpoint and no credentials
file the client signs nothing (the emulators take anonymous requests).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from sparkeos.core.errors import ConfigurationError, RetriableError

from .settings import carry_fix, find_setting
from .writeonce import (
    MIB,
    ObjectStoreFiles,
    StoreConflict,
    UploadLost,
    environment_identity,
    key_of,
)

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
ROOT_URL = "fs.gs.storage.root.url"
CREDENTIAL_ENVS = ("GOOGLE_", "CLOUDSDK_")
WRITER_META = "sparkeos-writer"
TIMEOUT_S = 60.0
RETRY_FIRST_S = 0.2
"""The client's first wait before it tries a request again (the library's is 1 s): a
lost reply or a reset costs one retry, and the next ones back off to 30 s."""

_clients: dict[tuple[str | None, str], Any] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class GcsFiles(ObjectStoreFiles):
    """One bucket of Google Cloud Storage; paths are ``/object/prefix`` inside it."""

    scheme: str
    bucket: str
    endpoint: str | None = None
    multipart_threshold: int = 8 * MIB
    """Objects above this size go up as a resumable upload in chunks of ``part_size``
    (at most 8 MiB: the client's limit for one request)."""
    part_size: int = 64 * MIB
    """A multiple of 256 KiB (the service's rule for chunks)."""
    retry_s: float = 120.0
    """How long the client retries one request (a reset, 429, 5xx) before it gives up."""
    endpoint_from: str = field(default="", compare=False)
    """The setting ``endpoint`` came from; empty: none, Google's own."""

    @classmethod
    def from_environment(cls, scheme: str, bucket: str) -> GcsFiles:
        endpoint, source = os.environ.get(EMULATOR_ENV), EMULATOR_ENV
        if not endpoint:
            found = find_setting(ROOT_URL)
            endpoint, source = (found.value, found.describe()) if found else (None, "")
        if endpoint and "://" not in endpoint:
            endpoint = f"http://{endpoint}"
        return cls(scheme, bucket, endpoint.rstrip("/") if endpoint else None,
                   endpoint_from=source)

    def uri(self, path: str) -> str:
        return f"{self.scheme}://{self.bucket}{path}"

    def where(self) -> str:
        return f"{self.scheme}://{self.bucket} at {self.endpoint or 'Google Cloud Storage'}"

    def credentials_identity(self) -> str:
        return environment_identity(CREDENTIAL_ENVS)

    def endpoint_origin(self) -> str:
        """Where the endpoint came from, for messages."""
        if self.endpoint_from:
            return f"the endpoint {self.endpoint} came from {self.endpoint_from}"
        return (f"no endpoint setting reached this process ({EMULATOR_ENV}, "
                f"spark.hadoop.{ROOT_URL}), so it used Google Cloud Storage's own")

    def endpoint_fix(self) -> str:
        return ("start the store, or point sparkeos at it: " + carry_fix([ROOT_URL])
                + f"; or set {EMULATOR_ENV} in the driver's and the executors' "
                "environment (it comes first)")

    # -- the client ----------------------------------------------------------------------------
    def _bucket(self) -> Any:
        key = (self.endpoint, self.credentials_identity())
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = _new_client(self.endpoint)
        return client.bucket(self.bucket)

    def _call(self, what: str, path: str, call: Callable[[], Any], *,
              creating: bool = False) -> Any:
        """One call on ``path``'s object, its failures in this package's terms."""
        from google.api_core import exceptions as api
        from google.auth.exceptions import DefaultCredentialsError, TransportError
        from requests.exceptions import RequestException

        try:
            return call()
        except api.PreconditionFailed:
            raise FileExistsError(self.uri(path)) from None
        except api.NotFound:
            if creating:
                # A create meets 404 for a missing bucket, or for its resumable upload's
                # session gone: completed by a try whose reply was lost (fake-gcs-server
                # forgets it then), settled by the writer token.
                if self._bucket_exists():
                    raise UploadLost(self.uri(path)) from None
                raise self._no_bucket() from None
            raise FileNotFoundError(self.uri(path)) from None
        except api.Conflict:
            raise StoreConflict(self.uri(path)) from None
        except (api.Unauthorized, api.Forbidden) as exc:
            raise ConfigurationError(
                f"{self.where()} refused {what} on {self.uri(path)}: {exc.message}",
                fix="give the service account storage.objects create, get, list and "
                "delete on the bucket (roles/storage.objectAdmin)") from None
        except DefaultCredentialsError:
            raise ConfigurationError(
                f"no credentials for {self.where()} ({self.endpoint_origin()})",
                fix="set GOOGLE_APPLICATION_CREDENTIALS in the driver's and the executors' "
                "environment (or run where the metadata server gives them); if the store "
                "is an emulator: " + self.endpoint_fix()) from None
        except (RequestException, TransportError, ConnectionError) as exc:
            raise RetriableError(
                f"{self.where()} cannot be reached ({what} {self.uri(path)}): {exc}; "
                f"{self.endpoint_origin()}", fix=self.endpoint_fix()) from None
        except api.RetryError as exc:
            cause = exc.cause
            unreachable = isinstance(cause, (RequestException, TransportError,
                                             ConnectionError))
            raise RetriableError(
                f"{self.where()} {'cannot be reached' if unreachable else 'failed'} "
                f"({what} {self.uri(path)}): {exc}; {self.endpoint_origin()}",
                fix=self.endpoint_fix() if unreachable else "retried with the batch"
            ) from None
        except (api.TooManyRequests, api.ServerError) as exc:
            raise RetriableError(
                f"{self.where()} failed {what} on {self.uri(path)}: {exc}",
                fix="retried with the batch") from None
        except api.GoogleAPICallError as exc:
            raise OSError(f"{what} {self.uri(path)}: {exc.code} {exc.message}") from None

    def _bucket_exists(self) -> bool:
        try:
            return bool(self._bucket().exists(timeout=TIMEOUT_S, retry=self._retry()))
        except Exception:  # cannot tell: the caller's error stands as "no bucket"
            return False

    def _no_bucket(self) -> ConfigurationError:
        return ConfigurationError(f"bucket {self.bucket} does not exist ({self.where()})",
                                  fix=f"create the bucket {self.bucket}, or check the URI")

    def _retry(self) -> Any:
        from google.cloud.storage.retry import DEFAULT_RETRY

        return DEFAULT_RETRY.with_delay(initial=RETRY_FIRST_S, multiplier=2.0,
                                        maximum=30.0).with_timeout(self.retry_s)

    def _blob(self, path: str, token: str | None = None) -> Any:
        blob = self._bucket().blob(key_of(path), chunk_size=self.part_size)
        if token is not None:
            blob.metadata = {WRITER_META: token}
        return blob

    # -- the primitives of a write-once store -----------------------------------------------
    def _put_if_absent(self, path: str, body: bytes | IO[bytes], token: str) -> None:
        blob = self._blob(path, token)
        if isinstance(body, bytes):
            self._call("create", path, lambda: blob.upload_from_string(
                body, if_generation_match=0, retry=self._retry(), timeout=TIMEOUT_S),
                creating=True)
        else:
            body.seek(0, os.SEEK_END)
            size = body.tell()
            self._call("create", path, lambda: blob.upload_from_file(
                body, rewind=True, size=self._size_for_client(size), if_generation_match=0,
                retry=self._retry(), timeout=TIMEOUT_S), creating=True)

    def _upload_if_absent(self, local_file: str, path: str, size: int, token: str) -> None:
        blob = self._blob(path, token)

        def upload() -> None:
            with open(local_file, "rb") as body:
                blob.upload_from_file(body, size=self._size_for_client(size),
                                      if_generation_match=0, retry=self._retry(),
                                      timeout=TIMEOUT_S)

        self._call("upload", path, upload, creating=True)

    def _size_for_client(self, size: int) -> int | None:
        """The size to tell Google's client: known, it sends an object up to its own
        limit (8 MiB) in one request; unknown (above ``multipart_threshold``), it opens a
        resumable session and sends ``part_size`` chunks, the precondition checked
        when the last one completes it."""
        return size if size <= self.multipart_threshold else None

    def _put(self, path: str, data: bytes) -> None:
        blob = self._blob(path)
        # Unconditional: sending it again writes the same bytes, so retrying is safe.
        self._call("write", path, lambda: blob.upload_from_string(
            data, retry=self._retry(), timeout=TIMEOUT_S), creating=True)

    def _copy_in_store_if_absent(self, staged: str, final: str, token: str) -> bool:
        source, target = self._blob(staged), self._blob(final, token)

        def rewrite() -> None:
            # A large object is rewritten in steps, each call resuming the last.
            rewrite_token = None
            while True:
                rewrite_token, _, _ = target.rewrite(
                    source, token=rewrite_token, if_generation_match=0,
                    retry=self._retry(), timeout=TIMEOUT_S)
                if rewrite_token is None:
                    return

        self._call("copy", final, rewrite)
        return True

    def _writer_of(self, path: str) -> str | None:
        blob = self._call("stat", path, lambda: self._bucket().get_blob(
            key_of(path), timeout=TIMEOUT_S, retry=self._retry()))
        token = (blob.metadata or {}).get(WRITER_META) if blob is not None else None
        return str(token) if token else None

    def _size(self, path: str) -> int:
        blob = self._call("stat", path, lambda: self._bucket().get_blob(
            key_of(path), timeout=TIMEOUT_S, retry=self._retry()))
        if blob is None:
            raise FileNotFoundError(self.uri(path))
        return int(blob.size or 0)

    def _get(self, path: str) -> bytes:
        data: bytes = self._call("read", path, lambda: self._blob(path).download_as_bytes(
            timeout=TIMEOUT_S, retry=self._retry()))
        return data

    def _get_into(self, path: str, sink: IO[bytes]) -> None:
        self._call("read", path, lambda: self._blob(path).download_to_file(
            sink, timeout=TIMEOUT_S, retry=self._retry()))

    def _keys(self, prefix: str) -> Iterator[str]:
        pages = self._call("list", "/" + prefix, lambda: self._bucket().list_blobs(
            prefix=prefix, timeout=TIMEOUT_S, retry=self._retry()).pages)
        while True:
            page = self._call("list", "/" + prefix, lambda: next(pages, None))
            if page is None:
                return
            yield from (blob.name for blob in page)

    def _names(self, prefix: str) -> list[str]:
        def listing() -> list[str]:
            found = self._bucket().list_blobs(prefix=prefix, delimiter="/",
                                              timeout=TIMEOUT_S, retry=self._retry())
            names = [blob.name[len(prefix):] for blob in found]
            names += [p[len(prefix):].rstrip("/") for p in found.prefixes]
            return [n for n in names if n]

        result: list[str] = self._call("list", "/" + prefix, listing)
        return result

    def _delete_object(self, path: str) -> None:
        try:
            self._call("delete", path, lambda: self._blob(path).delete(
                timeout=TIMEOUT_S, retry=self._retry()))
        except FileNotFoundError:
            pass


def signs_nothing(endpoint: str | None) -> bool:
    """Whether a client of ``endpoint`` in this process sends its requests unsigned: an
    endpoint setting (an emulator) and no credentials file. Every client of the store
    in sparkeos, and the libraries it hands the store to, follow this one rule."""
    return bool(endpoint) and not os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")


def _new_client(endpoint: str | None) -> Any:
    try:
        from google.cloud import storage
    except ImportError:
        raise ConfigurationError(
            "Google Cloud Storage needs google-cloud-storage, which is not installed",
            fix="pip install 'sparkeos[gcs]' on the driver and the executors",
        ) from None
    options = {"api_endpoint": endpoint} if endpoint else None
    if signs_nothing(endpoint):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or "sparkeos",
                              credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                              client_options=options)
    return storage.Client(client_options=options)


__all__ = ["EMULATOR_ENV", "GcsFiles", "signs_nothing"]
