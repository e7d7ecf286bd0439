"""Object stores as a ``Files``: write-once by conditional creates that know their writes.

An object store has no rename and no directories, but it has the one thing the
protocol needs: a create that succeeds only if the key is absent, and of two writers
racing for one key exactly one wins (S3: ``PUT`` with ``If-None-Match: *``, 412 to the
loser; GCS: ``ifGenerationMatch=0``, 412; Azure Blob: ``If-None-Match: *``, 409
``BlobAlreadyExists``). On it:

* **write-once creation** (``create_new``, ``upload_new``): a conditional create;
* **exclusive claim** (``claim_dir``): a conditional create of ``<dir>/.claim``;
* **publish without overwrite** (``publish``): the staged object copied to its final
  key by a conditional create (inside the store where it can copy conditionally:
  no round trip through the committing process). A create is atomic: a reader sees
  the whole object or none.

**A write knows its own object.** A reply can be lost after the store applied the
create (a reset connection, a timeout); the client library sends it again, and the
retry meets the object the first try made: "exists". Every conditional create
therefore carries a token of its own (object metadata), and "exists" is settled by
reading the token back: this write's token means the write succeeded, another token
means another writer won the race. A transient failure that outlasts the client's
retries is retried here with the same token.

A store that accepts the precondition but ignores it would let two claimers both win:
the first write-once call of a process on a store probes it (a key written twice, the
second time conditionally, must be refused) and refuses a store that fails the probe,
before anything of the caller is written. The probe is written beside what is being
written (beside a directory being claimed, never in it), and each probe removes the
probes older than an hour that a process died before removing.

**Whose verdict.** A Spark Python worker outlives queries, so the probe's verdict is
kept per store, not per process: per bucket, endpoint and credentials (the identity
``store_identity`` gives; another ``AWS_*`` environment may be another tenant of one
endpoint), for ``VERDICT_TTL_S`` at most, and forgotten as soon as a write-once call on
the store fails other than by "exists" (an unreachable or failing store may come back
as another server, e.g. one restored from an old image): the next call probes again.
A second query, or a restarted one, in the same worker so never relies on a verdict
about a store that may have been replaced since.

A store module gives the primitives (``_put_if_absent``, ``_put``, ``_writer_of``,
``_size``, ``_get``, ``_names``, ``_keys``, ``_delete_object``, and ``_copy_if_absent`` where
the store copies conditionally); everything above is here, once.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import tempfile
import threading
import time
import uuid
from abc import abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import IO

from sparkeos.core.errors import ConfigurationError, RetriableError
from sparkeos.core.storage.files import Files

CONFLICT_RETRIES = 5
"""A store answers "conflict" while another conditional write to the key is in flight
(S3's 409 ``ConditionalRequestConflict``); it asks to retry (then the loser learns)."""
TRANSIENT_RETRIES = 3
"""Conditional writes retried here with their token after the client library gave up
on a transient failure (a reset connection, 500, 503)."""
PROBE_PREFIX = ".sparkeos-probe-"
PROBE_STALE_S = 3600.0
"""A probe older than this was left by a process that died between its writes."""
MIB = 1024 * 1024
SPOOL_IN_MEMORY = 64 * MIB
"""A publish streamed through this process holds up to this much in memory, the rest
on disk."""

VERDICT_TTL_S = 600.0
"""How long a store's passed probe is trusted without probing again (a store can be
replaced behind its endpoint without any request failing: the client retries a reset
connection by itself)."""

StoreIdentity = tuple[str, str, str]
"""(store type, bucket and endpoint, credentials digest): ``store_identity``."""
_verified: dict[StoreIdentity, float] = {}
"""Stores that passed the probe, each with the ``monotonic()`` time it passed."""
_copies_conditionally: set[StoreIdentity] = set()
"""Of those, the stores whose in-store copy the probe found refusing an existing
destination."""
_verified_lock = threading.Lock()
monotonic = time.monotonic
"""The clock of the verdicts (a test's to replace)."""


class StoreConflict(Exception):
    """Another conditional write to the key is in flight: retry (not a lost race)."""


class UploadLost(FileNotFoundError):
    """A multipart upload is gone before its completion: completed by a try whose reply
    was lost (settled by the token), or removed by the store."""


class ObjectStoreFiles(Files):
    """A bucket (or container) of an object store; paths are ``/key/prefix`` inside it.

    Subclasses are frozen dataclasses naming the bucket and the endpoint (never
    credentials: they are read where the client is made, in each process)."""

    multipart_threshold: int
    """Objects above this size are uploaded in parts (where the store has parts)."""

    @property
    def atomic_create(self) -> bool:
        return True

    @abstractmethod
    def where(self) -> str:
        """The bucket and the endpoint, for messages."""

    def credentials_identity(self) -> str:
        """A digest of what this process's client authenticates with (never the
        secret itself): ``environment_identity`` of the variables the store's client
        reads."""
        return ""

    def store_identity(self) -> StoreIdentity:
        """What a verdict and a client are kept for: the store, its endpoint and who
        this process is on it."""
        return (type(self).__name__, self.where(), self.credentials_identity())

    # -- what each store gives ---------------------------------------------------------------
    @abstractmethod
    def _put_if_absent(self, path: str, body: bytes | IO[bytes], token: str) -> None:
        """Create ``path`` carrying ``token`` unless it exists: ``FileExistsError`` if it
        does (whoever wrote it), ``StoreConflict``, ``RetriableError``."""

    @abstractmethod
    def _put(self, path: str, data: bytes) -> None:
        """Write ``path`` whole, replacing it (one atomic request)."""

    @abstractmethod
    def _writer_of(self, path: str) -> str | None:
        """The token of the write that made ``path``; None if it does not exist (or was
        written without one)."""

    @abstractmethod
    def _size(self, path: str) -> int:
        """``path``'s size; ``FileNotFoundError`` if it does not exist."""

    @abstractmethod
    def _get(self, path: str) -> bytes: ...

    def _get_into(self, path: str, sink: IO[bytes]) -> None:
        sink.write(self._get(path))

    @abstractmethod
    def _keys(self, prefix: str) -> Iterator[str]:
        """Every key under ``prefix`` (a bounded prefix listing, never the bucket)."""

    @abstractmethod
    def _names(self, prefix: str) -> list[str]:
        """The names directly under ``prefix`` (keys and "directories", ``/`` delimited)."""

    @abstractmethod
    def _delete_object(self, path: str) -> None:
        """Delete one key; nothing if it does not exist."""

    def _delete_keys(self, path: str, keys: list[str]) -> None:
        for key in keys:
            self._delete_object("/" + key)

    def _copy_in_store_if_absent(self, staged: str, final: str, token: str) -> bool:
        """Copy ``staged`` to ``final`` inside the store, carrying ``token``, unless
        ``final`` exists (as ``_put_if_absent``); False: this store has no such copy."""
        return False

    def _copy_if_absent(self, staged: str, final: str, size: int, token: str) -> None:
        """Copy ``staged`` to ``final`` carrying ``token`` unless ``final`` exists (as
        ``_put_if_absent``): inside the store where the probe found its copy honours
        the precondition, else streamed through this process."""
        if self.store_identity() in _copies_conditionally and self._copy_in_store_if_absent(
                staged, final, token):
            return
        with tempfile.SpooledTemporaryFile(SPOOL_IN_MEMORY) as body:
            self._get_into(staged, body)
            body.seek(0)
            self._put_if_absent(final, body, token)

    def _upload_if_absent(self, local_file: str, path: str, size: int, token: str) -> None:
        """Upload a local file as ``_put_if_absent`` (a store with parts uploads a large
        one in parts, the completion conditional)."""
        with open(local_file, "rb") as body:
            self._put_if_absent(path, body, token)

    # -- write-once, once for every store ----------------------------------------------------
    def check_conditional_writes(self, near: str) -> None:
        """Refuse a store that ignores its create-if-absent precondition (once per
        store identity and ``VERDICT_TTL_S``, see the module docstring): a probe key
        beside ``near`` is written, then written again conditionally. Where the store
        copies inside itself, the probe is then copied onto itself conditionally:
        publishing copies in the store only if that is refused too (an emulator may
        honour one precondition and not the other)."""
        identity = self.store_identity()
        with _verified_lock:
            passed = _verified.get(identity)
        if passed is not None and monotonic() - passed < VERDICT_TTL_S:
            return
        beside = posixpath.dirname(near.rstrip("/")) or "/"
        probe = posixpath.join(beside, f"{PROBE_PREFIX}{int(time.time() * 1000)}-"
                                       f"{uuid.uuid4().hex}")
        self._put(probe, b"probe")
        try:
            try:
                self._put_if_absent(probe, b"again", uuid.uuid4().hex)
            except FileExistsError:
                pass
            except (OSError, ConfigurationError):
                raise self._no_conditional_writes("refused the conditional write") from None
            else:
                raise self._no_conditional_writes("overwrote an existing key")
            copies = self._copy_refuses_an_existing_key(probe)
            with _verified_lock:
                _verified[identity] = monotonic()
                if copies:
                    _copies_conditionally.add(identity)
                else:
                    _copies_conditionally.discard(identity)
        finally:
            try:
                self._delete_object(probe)
            except (OSError, RetriableError):
                pass  # the next probe here removes it, an hour on
            self._delete_stale_probes(beside)

    def _copy_refuses_an_existing_key(self, probe: str) -> bool:
        try:
            self._copy_in_store_if_absent(probe, probe, uuid.uuid4().hex)
        except FileExistsError:
            return True
        except (OSError, RetriableError, StoreConflict):
            return False  # streamed then: slower, never wrong
        return False  # no copy in this store, or one that overwrote the key

    def _delete_stale_probes(self, beside: str) -> None:
        """Probes a process left when it died between its writes (best effort)."""
        prefix = posixpath.join(dir_key(beside), PROBE_PREFIX)
        try:
            for key in self._keys(prefix):
                written = key[len(prefix):].split("-", 1)[0]
                if written.isdigit() and int(written) / 1000 < time.time() - PROBE_STALE_S:
                    self._delete_object("/" + key)
        except (OSError, RetriableError):
            pass

    def _no_conditional_writes(self, what: str) -> ConfigurationError:
        return ConfigurationError(
            f"{self.where()} does not honour conditional writes: a create-if-absent on an "
            f"existing key {what}. Write-once records, exclusive claims and publishing "
            "without overwrite all rest on it; without it two committers could both win",
            fix="use a store with conditional writes (Amazon S3, Google Cloud Storage, "
            "Azure Blob Storage, MinIO, Cloudflare R2, Ceph RGW of 2024 or later), or put "
            "the checkpoint and the output on HDFS or a shared POSIX path",
        )

    def forget_verdict(self) -> None:
        """Probe this store again before its next write-once call."""
        identity = self.store_identity()
        with _verified_lock:
            _verified.pop(identity, None)
            _copies_conditionally.discard(identity)

    def _create_once(self, path: str, token: str, send: Callable[[], None]) -> None:
        """``_send_once``; any failure but "exists" makes the next call probe again."""
        try:
            self._send_once(path, token, send)
        except FileExistsError:
            raise
        except BaseException:
            self.forget_verdict()
            raise

    def _send_once(self, path: str, token: str, send: Callable[[], None]) -> None:
        """Run ``send`` (a conditional create of ``path`` carrying ``token``) until the
        store answered it: "exists" or a vanished upload settled by the token read
        back, conflicts and transient failures retried as the same writer."""
        transient = 0
        for attempt in range(CONFLICT_RETRIES + TRANSIENT_RETRIES):
            try:
                send()
                return
            except FileExistsError:
                if self._writer_of(path) == token:
                    return  # a retry of this write met the object its lost reply made
                raise
            except UploadLost:
                if self._writer_of(path) == token:
                    return
                raise RetriableError(
                    f"{self.uri(path)}: the store lost the multipart upload before its "
                    "completion (a lifecycle rule aborting incomplete uploads?)",
                    fix="retried with the batch; give incomplete uploads a day or more "
                    "before a lifecycle rule aborts them") from None
            except StoreConflict:
                pass
            except RetriableError:
                transient += 1
                if transient > TRANSIENT_RETRIES:
                    raise
            time.sleep(0.05 * 2**min(attempt, 5))
        raise RetriableError(
            f"{self.uri(path)}: the store answered 'conflict' to {CONFLICT_RETRIES} "
            "conditional writes in a row", fix="retried with the batch")

    def _put_new(self, path: str, body: bytes | IO[bytes]) -> None:
        """Create ``path`` unless it exists (``FileExistsError``: another writer's)."""
        self.check_conditional_writes(path)
        token = uuid.uuid4().hex

        def send() -> None:
            if not isinstance(body, bytes):
                body.seek(0)
            self._put_if_absent(path, body, token)

        self._create_once(path, token, send)

    # -- Files ---------------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        try:
            self._size(path)
            return True
        except FileNotFoundError:
            return self.isdir(path)

    def isdir(self, path: str) -> bool:
        return next(iter(self._keys(dir_key(path))), None) is not None

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
        self.check_conditional_writes(path)
        size, token = os.path.getsize(local_file), uuid.uuid4().hex
        self._create_once(path, token,
                          lambda: self._upload_if_absent(local_file, path, size, token))

    def publish(self, staged: str, final: str) -> None:
        size = self._size(staged)
        self.check_conditional_writes(final)
        token = uuid.uuid4().hex
        self._create_once(final, token,
                          lambda: self._copy_if_absent(staged, final, size, token))

    def overwrite(self, path: str, data: bytes) -> None:
        # One request replaces a key atomically, and sending it again is harmless.
        self._put(path, data)

    def replace(self, src: str, dst: str) -> None:
        # A create replaces a key atomically; the source goes afterwards.
        self._put(dst, self.read(src))
        self._delete_object(src)

    def listdir(self, path: str) -> list[str]:
        return self._names(dir_key(path))

    def read(self, path: str) -> bytes:
        return self._get(path)

    def delete(self, path: str) -> None:
        self._delete_object(path)
        batch: list[str] = []
        for key in self._keys(dir_key(path)):
            batch.append(key)
            if len(batch) >= 1000:
                self._delete_keys(path, batch)
                batch = []
        if batch:
            self._delete_keys(path, batch)


def environment_identity(prefixes: Sequence[str]) -> str:
    """A digest of the environment variables named with ``prefixes`` (``AWS_``): a
    client made under other credentials is another client. Never printed; the digest
    does not give the secrets back."""
    digest = hashlib.sha256()
    for name in sorted(n for n in os.environ if n.startswith(tuple(prefixes))):
        digest.update(f"{name}\0{os.environ[name]}\0".encode())
    return digest.hexdigest()[:16]


def key_of(path: str) -> str:
    return posixpath.normpath(path).lstrip("/")


def dir_key(path: str) -> str:
    key = key_of(path)
    return "" if key in ("", ".") else f"{key}/"


__all__ = ["VERDICT_TTL_S", "ObjectStoreFiles", "StoreConflict", "UploadLost", "dir_key",
           "environment_identity", "key_of"]
