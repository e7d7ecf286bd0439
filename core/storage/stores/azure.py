"""Azure Blob Storage (``abfs[s]://``, ``wasb[s]://``) as a ``Files``: write-once by
``If-None-Match: *``.

A ``Put Blob`` (or a ``Put Block List`` completing a blob uploaded in blocks) with
``If-None-Match: *`` succeeds only if the blob is absent; the loser of a race gets
``409 BlobAlreadyExists``. The writer token is the blob metadata ``sparkeoswriter``
(metadata names are C# identifiers: no dash), settled by ``core.storage.stores.writeonce``.
Blobs above ``multipart_threshold`` go up in blocks, the block list committed
conditionally. A publish is a ``Copy Blob`` inside the account with ``If-None-Match: *``
on the destination (where the probe found it honoured), waited for if the service
answers "pending".

Both URI forms of Hadoop's connectors name one blob: ``abfs[s]://container@account.dfs.
core.windows.net/path`` (ADLS Gen2) and ``wasb[s]://container@account.blob.core.windows.
net/path``. sparkeos speaks the Blob API to ``https://<account>.blob.<suffix>``; on an
account with a hierarchical namespace the Blob API's conditional writes work the same.

Credentials are read in each process, never part of this object:
``AZURE_STORAGE_CONNECTION_STRING`` (for the account it names), else
``AZURE_STORAGE_KEY``, else ``AZURE_STORAGE_SAS_TOKEN``, else azure-identity's
``DefaultAzureCredential`` if installed (a process keeps one client per endpoint and
``AZURE_*`` environment). The endpoint comes from the connection string's
``BlobEndpoint`` for its account (Azurite: ``http://127.0.0.1:10000/devstoreaccount1``),
else from the URI's host; it is resolved on the driver and travels with the object to
the tasks. No Hadoop setting is read: the ABFS connector's per-account settings
(``fs.azure.account.key.<account>.dfs.core.windows.net``...) are credentials and
authentication, and its endpoint is the URI's host, as here.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from sparkeos.core.errors import ConfigurationError, RetriableError
from sparkeos.core.storage.locations import Location

from .writeonce import MIB, ObjectStoreFiles, StoreConflict, environment_identity, key_of

CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
KEY_ENV = "AZURE_STORAGE_KEY"
SAS_ENV = "AZURE_STORAGE_SAS_TOKEN"
WRITER_META = "sparkeoswriter"
TIMEOUT_S = 60
COPY_WAIT_S = 600.0
CREDENTIAL_ENVS = ("AZURE_",)
RETRY_BACKOFF_S = 0.5
"""The client's wait between tries of one request (the SDK's default is 15 s, then
more): a lost reply or a reset costs one retry, and ``_create_once`` retries past
these."""

_clients: dict[tuple[str, str, int, int, int, float, str], Any] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class AzureBlobFiles(ObjectStoreFiles):
    """One container of an Azure storage account; paths are ``/blob/prefix`` inside it."""

    scheme: str
    container: str
    host: str
    """The URI's host: ``account.dfs.core.windows.net`` or ``account.blob...``."""
    endpoint: str
    """The Blob service's URL for the account."""
    multipart_threshold: int = 64 * MIB
    part_size: int = 64 * MIB
    """Blocks' size for blobs uploaded in blocks (Azure: 4000 MiB at most)."""
    retries: int = 5
    """Tries the client makes of one request after the first, ``RETRY_BACKOFF_S``
    apart."""
    endpoint_from: str = field(default="", compare=False)
    """Where ``endpoint`` came from, for messages."""

    @classmethod
    def from_location(cls, location: str, parsed: Location) -> AzureBlobFiles:
        container, at, host = parsed.authority.partition("@")
        if not at or not container or not host:
            raise ConfigurationError(
                f"{location!r} names no container and account",
                fix=f"write {parsed.scheme}://<container>@<account>.dfs.core.windows.net/path")
        account = host.split(".", 1)[0]
        endpoint = _connection_string_endpoint(account)
        source = f"{CONNECTION_STRING_ENV} (account {account})"
        if endpoint is None:
            suffix = host.split(".", 2)[2] if host.count(".") >= 2 else "core.windows.net"
            endpoint = f"https://{account}.blob.{suffix}"
            source = f"the URI's host {host} ({CONNECTION_STRING_ENV} names no account " \
                     f"{account})"
        return cls(parsed.scheme, container, host, endpoint.rstrip("/"),
                   endpoint_from=source)

    @property
    def account(self) -> str:
        return self.host.split(".", 1)[0]

    def uri(self, path: str) -> str:
        return f"{self.scheme}://{self.container}@{self.host}{path}"

    def where(self) -> str:
        return f"{self.scheme}://{self.container}@{self.host} at {self.endpoint}"

    def credentials_identity(self) -> str:
        return environment_identity(CREDENTIAL_ENVS)

    def endpoint_origin(self) -> str:
        """Where the endpoint came from, for messages."""
        return f"the endpoint {self.endpoint} came from {self.endpoint_from or 'the URI'}"

    def endpoint_fix(self) -> str:
        return (f"start the store, or give its endpoint: {CONNECTION_STRING_ENV} with "
                f"AccountName={self.account} and BlobEndpoint=<url> in the driver's and "
                "the executors' environment (Azure's endpoint is no Spark setting: "
                "format options and sparkeos.register(spark) do not change it), or check "
                "the URI's account and host")

    # -- the client ----------------------------------------------------------------------------
    def _container(self) -> Any:
        key = (self.endpoint, self.container, self.multipart_threshold, self.part_size,
               self.retries, RETRY_BACKOFF_S, self.credentials_identity())
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = _new_client(self)
        return client

    def _call(self, what: str, path: str, call: Callable[[], Any]) -> Any:
        """One call on ``path``'s blob, its failures in this package's terms."""
        from azure.core import exceptions as az

        try:
            return call()
        except az.ResourceExistsError as exc:
            if _code(exc) in ("BlobAlreadyExists", "ConditionNotMet"):
                raise FileExistsError(self.uri(path)) from None
            raise StoreConflict(f"{self.uri(path)}: {_code(exc)}") from None
        except az.ResourceModifiedError:  # 412 ConditionNotMet
            raise FileExistsError(self.uri(path)) from None
        except az.ResourceNotFoundError as exc:
            if _code(exc) == "ContainerNotFound":
                raise ConfigurationError(
                    f"container {self.container} does not exist ({self.where()})",
                    fix=f"create the container {self.container}, or check the URI") from None
            raise FileNotFoundError(self.uri(path)) from None
        except az.ClientAuthenticationError as exc:
            raise ConfigurationError(
                f"{self.where()} refused {what} on {self.uri(path)}: {_code(exc)}",
                fix=f"set {CONNECTION_STRING_ENV} (or {KEY_ENV}, {SAS_ENV}) for account "
                f"{self.account} in the driver's and the executors' environment, with "
                "read, write, list and delete rights on the container") from None
        except (az.ServiceRequestError, az.ServiceResponseError) as exc:
            raise RetriableError(
                f"{self.where()} cannot be reached ({what} {self.uri(path)}): {exc}; "
                f"{self.endpoint_origin()}", fix=self.endpoint_fix()) from None
        except az.HttpResponseError as exc:
            status = exc.status_code or 0
            if status >= 500 or status == 429:
                raise RetriableError(f"{self.where()} answered {status} {_code(exc)} "
                                     f"to {what} on {self.uri(path)}",
                                     fix="retried with the batch") from None
            if status == 409:
                raise StoreConflict(f"{self.uri(path)}: {_code(exc)}") from None
            raise OSError(f"{what} {self.uri(path)}: {status} {_code(exc)}") from None

    def _blob(self, path: str) -> Any:
        return self._container().get_blob_client(key_of(path))

    # -- the primitives of a write-once store -----------------------------------------------
    def _put_if_absent(self, path: str, body: bytes | IO[bytes], token: str) -> None:
        blob = self._blob(path)
        self._call("create", path, lambda: blob.upload_blob(
            body, overwrite=False, metadata={WRITER_META: token}, timeout=TIMEOUT_S))

    def _put(self, path: str, data: bytes) -> None:
        blob = self._blob(path)
        self._call("write", path, lambda: blob.upload_blob(data, overwrite=True,
                                                           timeout=TIMEOUT_S))

    def _copy_in_store_if_absent(self, staged: str, final: str, token: str) -> bool:
        source, target = self._blob(staged), self._blob(final)

        def copy() -> None:
            answer = target.start_copy_from_url(source.url, metadata={WRITER_META: token},
                                                if_none_match="*", timeout=TIMEOUT_S)
            status, deadline = answer.get("copy_status"), time.monotonic() + COPY_WAIT_S
            while status == "pending" and time.monotonic() < deadline:
                time.sleep(0.2)
                status = target.get_blob_properties().copy.status
            if status != "success":
                raise OSError(f"copy of {self.uri(staged)} to {self.uri(final)} ended "
                              f"{status}")

        self._call("copy", final, copy)
        return True

    def _writer_of(self, path: str) -> str | None:
        try:
            properties = self._call("stat", path, lambda: self._blob(path).get_blob_properties(
                timeout=TIMEOUT_S))
        except FileNotFoundError:
            return None
        token = (properties.metadata or {}).get(WRITER_META)
        return str(token) if token else None

    def _size(self, path: str) -> int:
        properties = self._call("stat", path, lambda: self._blob(path).get_blob_properties(
            timeout=TIMEOUT_S))
        return int(properties.size)

    def _get(self, path: str) -> bytes:
        data: bytes = self._call("read", path, lambda: self._blob(path).download_blob(
            timeout=TIMEOUT_S).readall())
        return data

    def _get_into(self, path: str, sink: IO[bytes]) -> None:
        self._call("read", path, lambda: self._blob(path).download_blob(
            timeout=TIMEOUT_S).readinto(sink))

    def _keys(self, prefix: str) -> Iterator[str]:
        pages = self._call("list", "/" + prefix, lambda: self._container().list_blob_names(
            name_starts_with=prefix, timeout=TIMEOUT_S).by_page())
        while True:
            page = self._call("list", "/" + prefix, lambda: next(pages, None))
            if page is None:
                return
            yield from page

    def _names(self, prefix: str) -> list[str]:
        def listing() -> list[str]:
            found = self._container().walk_blobs(name_starts_with=prefix, delimiter="/",
                                                 timeout=TIMEOUT_S)
            names = [item.name[len(prefix):].rstrip("/") for item in found]
            return [n for n in names if n]

        result: list[str] = self._call("list", "/" + prefix, listing)
        return result

    def _delete_object(self, path: str) -> None:
        try:
            self._call("delete", path, lambda: self._blob(path).delete_blob(timeout=TIMEOUT_S))
        except FileNotFoundError:
            pass


def _code(exc: Exception) -> str:
    """The service's error code of an azure-core error (``BlobAlreadyExists``)."""
    return str(getattr(exc, "error_code", "") or "")


def _connection_string_fields() -> dict[str, str]:
    text = os.environ.get(CONNECTION_STRING_ENV, "")
    fields = {}
    for part in text.split(";"):
        name, eq, value = part.partition("=")
        if eq:
            fields[name.strip()] = value.strip()
    return fields


def _connection_string_endpoint(account: str) -> str | None:
    fields = _connection_string_fields()
    if fields.get("AccountName") != account:
        return None
    if fields.get("BlobEndpoint"):
        return fields["BlobEndpoint"]
    protocol = fields.get("DefaultEndpointsProtocol", "https")
    suffix = fields.get("EndpointSuffix", "core.windows.net")
    return f"{protocol}://{account}.blob.{suffix}"


def shared_secret(account: str) -> tuple[str, str] | None:
    """The account key (``("key", ...)``) or SAS token (``("sas", ...)``) this process's
    environment gives ``account``, in the order sparkeos' own client takes them; None:
    neither (Azure AD then)."""
    fields = _connection_string_fields()
    if fields.get("AccountName") == account and fields.get("AccountKey"):
        return "key", fields["AccountKey"]
    if fields.get("AccountName") == account and fields.get("SharedAccessSignature"):
        return "sas", fields["SharedAccessSignature"]
    if os.environ.get(KEY_ENV):
        return "key", os.environ[KEY_ENV]
    if os.environ.get(SAS_ENV):
        return "sas", os.environ[SAS_ENV]
    return None


def _credential(files: AzureBlobFiles) -> Any:
    secret = shared_secret(files.account)
    if secret is not None:
        kind, value = secret
        return {"account_name": files.account, "account_key": value} if kind == "key" \
            else value
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ConfigurationError(
            f"no credentials for {files.where()}",
            fix=f"set {CONNECTION_STRING_ENV} (or {KEY_ENV} or {SAS_ENV}) in the driver's "
            "and the executors' environment, or pip install azure-identity for Azure AD",
        ) from None
    return DefaultAzureCredential()


def _new_client(files: AzureBlobFiles) -> Any:
    try:
        from azure.storage.blob import ContainerClient, LinearRetry
    except ImportError:
        raise ConfigurationError(
            "Azure Blob Storage needs azure-storage-blob, which is not installed",
            fix="pip install 'sparkeos[azure]' on the driver and the executors",
        ) from None
    retry = LinearRetry(backoff=RETRY_BACKOFF_S,  # type: ignore[arg-type]
                        random_jitter_range=min(0.2, RETRY_BACKOFF_S / 2),  # type: ignore[arg-type]
                        retry_total=files.retries)
    return ContainerClient(files.endpoint, files.container, credential=_credential(files),
                           max_single_put_size=files.multipart_threshold,
                           max_block_size=files.part_size, retry_policy=retry,
                           connection_timeout=10, read_timeout=TIMEOUT_S)


__all__ = ["CONNECTION_STRING_ENV", "AzureBlobFiles", "shared_secret"]
