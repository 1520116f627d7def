"""The S3 side of the store: boto3, conditional create-only PUTs, ranged reads.

- ``put_new`` is ``PutObject`` with ``If-None-Match: *``. HTTP 412 (PreconditionFailed) means
  the key exists; the object is then compared with our bytes (``_holds_same``: the size, the
  ETag S3 gives our bytes, else, where the ETag is no MD5 as under SSE-KMS, the object read
  back), so a retry whose first attempt landed (lost response) counts as done, for
  ``put_new_file`` too, and anything else is AlreadyExistsError. 409
  ConditionalRequestConflict (a concurrent conditional write) is transient.
- Throttling and 5xx (503 SlowDown, 500) and connection errors are retried by botocore's
  ``standard`` retry mode (``DRAFTDATA_S3_MAX_ATTEMPTS``, default 8); what is left is mapped to
  TransientStoreError (an outage generate waits out) here, in ``_map_error``, the one place raw
  S3 errors become draftdata's. Access denied and missing, invalid or expired credentials are
  StoreAccessError, and every other error a StoreError: waiting cures neither.
- ``put_new_file`` streams a local file: one conditional ``PutObject`` up to ``PART_SIZE``
  (64 MiB), else a multipart upload whose ``CompleteMultipartUpload`` carries
  ``If-None-Match: *`` (parts are invisible until then; a failed upload is aborted, which
  removes only its own unfinished parts, never an object).
- Reads: ``open_input`` is a seekable reader that issues one ranged GET per ``read`` call, so
  pyarrow fetches a parquet footer and only the column chunks it needs.

Credentials, region and endpoint come from the standard AWS configuration (environment
variables, ``AWS_PROFILE`` / config files, ``AWS_ENDPOINT_URL``, instance roles). Nothing here
logs or stores them. There is no delete and no unconditional put.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import io
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

from draftdata.errors import (
    AlreadyExistsError,
    StoreAccessError,
    StoreError,
    TransientStoreError,
)
from draftdata.store.base import Store, check_key

_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "ConditionalRequestConflict",
        "OperationAborted",
    }
)
PART_SIZE = 64 << 20  # single PUT up to this size; above it, multipart parts of this size
_clients: dict[tuple[int, str], Any] = {}
_clients_lock = threading.Lock()


def _client() -> Any:
    """One boto3 S3 client per process (boto3 clients are thread-safe; sessions are not)."""
    # keyed by pid (no sharing across fork) and endpoint (tests repoint AWS_ENDPOINT_URL)
    cache_key = (os.getpid(), os.environ.get("AWS_ENDPOINT_URL", ""))
    with _clients_lock:
        client = _clients.get(cache_key)
        if client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise StoreError(
                    "s3:// needs boto3: pip install 'draftdata[s3]' (or pip install boto3)"
                ) from exc
            attempts = int(os.environ.get("DRAFTDATA_S3_MAX_ATTEMPTS", "8"))
            config = Config(
                retries={"mode": "standard", "max_attempts": attempts},
                max_pool_connections=32,
                connect_timeout=10,
                read_timeout=60,
            )
            client = boto3.session.Session().client("s3", config=config)
            _clients[cache_key] = client
        return client


# the store refuses this identity: denied by a policy, or credentials it does not accept
_DENIED_CODES = frozenset({"AccessDenied", "AllAccessDisabled", "AccountProblem"})
_BAD_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "InvalidClientTokenId",
        "InvalidSecurity",
        "MissingSecurityHeader",
        "AuthorizationHeaderMalformed",
    }
)
_EXPIRED_CODES = frozenset({"ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired"})
# botocore's errors for credentials it cannot find or load (env, profile, SSO, instance role)
_CREDENTIAL_ERRORS = (
    "NoCredentialsError",
    "PartialCredentialsError",
    "CredentialRetrievalError",
    "NoAuthTokenError",
    "TokenRetrievalError",
    "SSOError",
    "RefreshWithMFAUnsupportedError",
)
_CREDENTIALS_FIX = (
    "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), AWS_PROFILE, or run "
    "on a machine with an instance role"
)


def _map_error(exc: Exception, what: str) -> StoreError:
    """The draftdata error for a raw botocore error during ``what`` (a URL and an action).

    Only an outage (throttling, 5xx, a timeout, a connection error) becomes a
    TransientStoreError, which generate waits out; access denied and missing, invalid or
    expired credentials become StoreAccessError; anything else a StoreError that stops."""
    from botocore import exceptions as bex

    if isinstance(exc, bex.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in ("PreconditionFailed",) or status == 412:
            return AlreadyExistsError(f"{what}: the object already exists")
        if code in _TRANSIENT_CODES or status >= 500 or status in (409, 429):
            return TransientStoreError(f"{what}: S3 {status} {code} (transient; retried)")
        if code in ("NoSuchKey", "404", "NotFound") or status == 404:
            return StoreError(f"{what}: no such object")
        if code == "NoSuchBucket":
            return StoreError(f"{what}: the bucket does not exist; check the URL or create it")
        if code in _EXPIRED_CODES:
            return StoreAccessError(
                f"{what}: the AWS credentials have expired ({code}); renew them (a new session "
                "token, `aws sso login`, ...) and run the same command: committed work is kept"
            )
        if code in _BAD_CREDENTIAL_CODES or status == 401:
            return StoreAccessError(
                f"{what}: S3 does not accept the AWS credentials ({code or status}); check "
                f"AWS_PROFILE or the keys: {_CREDENTIALS_FIX}"
            )
        if code == "403":  # a HEAD's answer has no body, so no reason
            return StoreAccessError(
                f"{what}: access denied (S3 403 to a request S3 gives no reason for); check "
                "the bucket policy, the IAM permissions and the credentials"
            )
        if code in _DENIED_CODES or status == 403:
            return StoreAccessError(
                f"{what}: access denied (S3 {status} {code}); this identity may not do it: "
                "check the bucket policy and the IAM permissions (or the credentials)"
            )
        if code == str(status):  # a HEAD's answer has no body, so no reason
            return StoreError(
                f"{what}: S3 answered HTTP {status} without a reason (expired credentials "
                "answer a HEAD request so); check the credentials and the URL"
            )
        return StoreError(f"{what}: S3 error {status} {code}: {err.get('Message', '')}")
    if isinstance(exc, tuple(getattr(bex, n) for n in _CREDENTIAL_ERRORS if hasattr(bex, n))):
        return StoreAccessError(f"{what}: no usable AWS credentials ({exc}); {_CREDENTIALS_FIX}")
    if isinstance(exc, bex.ConnectionError | bex.HTTPClientError | bex.IncompleteReadError):
        return TransientStoreError(f"{what}: connection problem ({type(exc).__name__})")
    if isinstance(exc, bex.BotoCoreError):
        return StoreError(f"{what}: {exc}")
    raise exc


def _is_missing(exc: Exception) -> bool:
    from botocore import exceptions as bex

    if not isinstance(exc, bex.ClientError):
        return False
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return status == 404 or code in ("NoSuchKey", "404", "NotFound")


def _botocore_errors() -> tuple[type[Exception], ...]:
    from botocore import exceptions as bex

    return (bex.ClientError, bex.BotoCoreError)


class S3Store(Store):
    """A store under ``s3://bucket/prefix``."""

    def __init__(self, bucket: str, prefix: str, protect: Sequence[str] = ()) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        super().__init__(url, protect)

    def child(self, prefix: str) -> S3Store:
        """A store rooted at ``prefix`` inside this one."""
        sub = check_key(prefix.strip("/"))
        return S3Store(self.bucket, f"{self.prefix}/{sub}" if self.prefix else sub, self.protect)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, fn: str, *, missing_ok: bool = False, **kwargs: Any) -> Any:
        """Call one S3 operation; errors mapped; None for a missing object if ``missing_ok``."""
        try:
            return getattr(_client(), fn)(Bucket=self.bucket, **kwargs)
        except _botocore_errors() as exc:
            if missing_ok and _is_missing(exc):
                return None
            raise _map_error(exc, what) from exc

    def _put_new(self, key: str, data: bytes) -> None:
        what = f"{self.key_url(key)}: create"
        try:
            self._call(what, "put_object", Key=self._key(key), Body=data, IfNoneMatch="*")
        except AlreadyExistsError:
            if not self._holds(key, data):
                raise AlreadyExistsError(
                    f"{self.key_url(key)}: already exists (HTTP 412); the store never overwrites"
                ) from None

    def _put_new_file(self, key: str, path: Path) -> None:
        what = f"{self.key_url(key)}: create"
        size = path.stat().st_size
        try:
            if size <= PART_SIZE:
                with path.open("rb") as fh:
                    self._call(what, "put_object", Key=self._key(key), Body=fh, IfNoneMatch="*")
            else:
                self._multipart(what, key, path)
        except AlreadyExistsError:
            if not self._holds_file(key, path, size):
                raise AlreadyExistsError(
                    f"{self.key_url(key)}: already exists (HTTP 412); the store never overwrites"
                ) from None

    def _multipart(self, what: str, key: str, path: Path) -> None:
        up = self._call(what, "create_multipart_upload", Key=self._key(key))
        upload_id = up["UploadId"]
        parts = []
        try:
            with path.open("rb") as fh:
                number = 1
                while chunk := fh.read(PART_SIZE):
                    resp = self._call(
                        what,
                        "upload_part",
                        Key=self._key(key),
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=chunk,
                    )
                    parts.append({"ETag": resp["ETag"], "PartNumber": number})
                    number += 1
            self._call(
                what,
                "complete_multipart_upload",
                Key=self._key(key),
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
                IfNoneMatch="*",
            )
        except BaseException:
            # drop our unfinished parts (this never touches a completed object)
            with contextlib.suppress(StoreError):
                self._call(what, "abort_multipart_upload", Key=self._key(key), UploadId=upload_id)
            raise

    def _holds_file(self, key: str, path: Path, size: int) -> bool:
        """Whether ``key`` holds exactly the bytes of ``path`` (a retried upload that had
        landed)."""
        return self._holds_same(
            key,
            size,
            lambda multipart: _file_etag(path, PART_SIZE if multipart else None),
            lambda: _file_etag(path, None),
        )

    def _holds(self, key: str, data: bytes) -> bool:
        """Whether ``key`` holds exactly ``data`` (a retried PUT that had landed)."""
        digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
        return self._holds_same(key, len(data), lambda multipart: digest, lambda: digest)

    def _holds_same(
        self,
        key: str,
        size: int,
        etag_of: Callable[[bool], str],
        md5_of: Callable[[], str],
    ) -> bool:
        """Whether ``key`` holds our bytes: ``size`` long, and the ETag S3 would give them
        (``etag_of(multipart)``) or, where the ETag is no MD5 (SSE-KMS, SSE-C), the MD5 of
        the object read back equal to ours (``md5_of()``). The one check of every create-only
        write that met an object at its key (generate's, tokenize's, merge's and hidden
        states' shards, export's files)."""
        head = self._call(f"{self.key_url(key)}: head", "head_object", Key=self._key(key))
        if int(head.get("ContentLength", -1)) != size:
            return False
        etag = str(head.get("ETag", "")).strip('"')
        if etag == etag_of("-" in etag):
            return True
        return self._read_md5(key) == md5_of()

    def _read_md5(self, key: str) -> str:
        """The MD5 of the object at ``key``, read back in pieces (any size, bounded memory)."""
        what = f"{self.key_url(key)}: read"
        resp = self._call(what, "get_object", Key=self._key(key))
        digest = hashlib.md5(usedforsecurity=False)
        try:
            for chunk in resp["Body"].iter_chunks(8 << 20):
                digest.update(chunk)
        except _botocore_errors() as exc:
            raise _map_error(exc, what) from exc
        return digest.hexdigest()

    def _read(self, key: str) -> bytes:
        what = f"{self.key_url(key)}: read"
        resp = self._call(what, "get_object", Key=self._key(key))
        try:
            return cast(bytes, resp["Body"].read())
        except _botocore_errors() as exc:
            raise _map_error(exc, what) from exc

    def _read_range(self, key: str, start: int, length: int) -> bytes:
        what = f"{self.key_url(key)}: read"
        rng = f"bytes={start}-{start + length - 1}"
        resp = self._call(what, "get_object", missing_ok=True, Key=self._key(key), Range=rng)
        if resp is None:
            raise StoreError(f"{what}: no such object")
        try:
            return cast(bytes, resp["Body"].read())
        except _botocore_errors() as exc:
            raise _map_error(exc, what) from exc

    def _list(self, prefix: str) -> builtins.list[str]:
        base = f"{self.prefix}/" if self.prefix else ""
        out: builtins.list[str] = []
        what = f"{self.url}/{prefix}: list"
        try:
            pages = (
                _client()
                .get_paginator("list_objects_v2")
                .paginate(Bucket=self.bucket, Prefix=base + prefix)
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    out.append(str(obj["Key"])[len(base) :])
        except _botocore_errors() as exc:
            raise _map_error(exc, what) from exc
        return out

    def list_sizes(self, prefix: str = "") -> dict[str, int]:
        """key -> size from the listing's pages (one request per 1,000 keys)."""
        base = f"{self.prefix}/" if self.prefix else ""
        out: dict[str, int] = {}
        try:
            pages = (
                _client()
                .get_paginator("list_objects_v2")
                .paginate(Bucket=self.bucket, Prefix=base + prefix)
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    out[str(obj["Key"])[len(base) :]] = int(obj["Size"])
        except _botocore_errors() as exc:
            raise _map_error(exc, f"{self.url}/{prefix}: list") from exc
        return out

    def _exists(self, key: str) -> bool:
        what = f"{self.key_url(key)}: head"
        return self._call(what, "head_object", missing_ok=True, Key=self._key(key)) is not None

    def _size(self, key: str) -> int:
        head = self._call(f"{self.key_url(key)}: head", "head_object", Key=self._key(key))
        return int(head["ContentLength"])

    def _open_input(self, key: str) -> BinaryIO:
        return cast(BinaryIO, _RangeReader(self, key, self._size(key)))


def _file_etag(path: Path, part_size: int | None) -> str:
    """The S3 ETag of ``path``: its MD5, or for a multipart upload with ``part_size`` parts the
    MD5 of the parts' MD5s plus ``-<parts>``."""
    whole = hashlib.md5(usedforsecurity=False)
    digests = []
    with path.open("rb") as fh:
        while chunk := fh.read(part_size or (8 << 20)):
            if part_size:
                digests.append(hashlib.md5(chunk, usedforsecurity=False).digest())
            else:
                whole.update(chunk)
    if part_size is None:
        return whole.hexdigest()
    return hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest() + f"-{len(digests)}"


class _RangeReader(io.RawIOBase):
    """A seekable, read-only file over one S3 object: each ``read`` is one ranged GET."""

    def __init__(self, store: S3Store, key: str, size: int) -> None:
        super().__init__()
        self._store = store
        self._key = key
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise ValueError("negative seek position")
        self._pos = pos
        return pos

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = self._size - self._pos
        size = min(size, max(0, self._size - self._pos))
        if size == 0:
            return b""
        data = self._store.read_range(self._key, self._pos, size)
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)
