"""`store`: the durable store of a managed run (s3://, gs://, file://), from a node or anywhere.

One client code for the nodes (`remote.pyz store push|pull`, remote/storesync.py), the
controller and the user's machine (provision/job/managed/). Standard library only at import:
boto3 and google-cloud-storage are imported when an s3:// or gs:// store is opened. Endpoints
are the SDKs' own settings (AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL for boto3,
STORAGE_EMULATOR_HOST for google-cloud-storage), so a local S3 or GCS stand-in is reached by
the same code. Every key obeys remote/storekeys.py's rule (a key that would leave its folder
is refused before any call); `put_new` writes only a key nobody wrote yet (conditional writes:
two writers of job ids or records never overwrite each other).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from remote.files import is_partial, replacing
from remote.storekeys import checked_key, inside

PART_BYTES = 8 * 1024 * 1024  # multipart part / GCS chunk size
THREADS = 8
# Bounded waits on the network: an endpoint that drops packets fails a call in about
# ATTEMPTS x (CONNECT_S or READ_S) instead of hanging for minutes (botocore's defaults are 60 s
# each over 5 attempts; google-cloud-storage retries for 120 s). READ_S is per socket read,
# not per transfer: a large part still uploads as long as bytes keep moving.
CONNECT_S = 5.0
READ_S = 30.0
ATTEMPTS = 3
SCHEMES = ("s3", "gs", "file")


class StoreError(Exception):
    """A store operation failed; the message says which and why."""


@dataclass(frozen=True)
class StoreURL:
    scheme: str  # s3 | gs | file
    bucket: str  # "" for file://
    prefix: str  # no leading or trailing "/" (file://: the absolute folder, leading "/")

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{self.prefix}"
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")

    def child(self, *parts: str) -> StoreURL:
        joined = "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))
        if self.scheme == "file":
            joined = "/" + joined
        return StoreURL(self.scheme, self.bucket, joined)


def parse_url(url: str) -> StoreURL:
    """s3://bucket[/prefix], gs://bucket[/prefix], file:///absolute/folder. ValueError saying
    what a valid one looks like otherwise."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(f"{url!r} is not a store URL: use s3://BUCKET/PREFIX, "
                         "gs://BUCKET/PREFIX or file:///ABSOLUTE/FOLDER")
    if scheme == "file":
        if not rest.startswith("/") or rest.strip("/") == "":
            raise ValueError(f"{url!r}: a file:// store needs an absolute folder other than /, "
                             "e.g. file:///mnt/shared/mgpu")
        return StoreURL("file", "", "/" + rest.strip("/"))
    bucket, _, prefix = rest.partition("/")
    if not bucket or any(c in bucket for c in " :?#"):
        raise ValueError(f"{url!r}: no valid bucket name after {scheme}://")
    return StoreURL(scheme, bucket, prefix.strip("/"))


class Store(Protocol):
    """A folder of objects. Keys are "/"-separated and relative to the store's URL."""

    url: StoreURL

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def put_new(self, key: str, data: bytes) -> bool:
        """Write `key` only if no object has that key (S3 If-None-Match, GCS
        if_generation_match=0, a hard link on a filesystem): False when one was there, so two
        writers of the same key never overwrite each other."""
        ...

    def get_bytes(self, key: str) -> bytes | None:
        """None when there is no such object."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Every key under `prefix` (sorted)."""
        ...

    def delete(self, key: str) -> None:
        """Idempotent."""
        ...

    def upload_file(self, path: str, key: str) -> None: ...

    def download_file(self, key: str, path: str) -> None: ...


def _join(url: StoreURL, key: str) -> str:
    key = key.strip("/")
    return "/".join(p for p in (url.prefix, checked_key(key) if key else "") if p)


def _folder(url: StoreURL, prefix: str) -> str:
    """The object-name prefix of a "folder" of the store ("" for the bucket's root)."""
    full = _join(url, prefix)
    return full + "/" if full else ""


class FileStore:
    """A folder on a filesystem every node mounts. Writes are atomic (temp file + rename)."""

    def __init__(self, url: StoreURL) -> None:
        self.url = url

    def _path(self, key: str) -> str:
        key = key.strip("/")
        return inside(self.url.prefix, key) if key else self.url.prefix

    def _write(self, key: str, fill: Callable[[str], None]) -> None:
        target = self._path(key)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with replacing(target, fsync=False) as tmp:  # a checkpoint may be large: no fsync
            fill(tmp)

    def put_bytes(self, key: str, data: bytes) -> None:
        def fill(tmp: str) -> None:
            with open(tmp, "wb") as fh:
                fh.write(data)

        self._write(key, fill)

    def put_new(self, key: str, data: bytes) -> bool:
        target = self._path(key)
        folder, name = os.path.split(target)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o600)
            os.link(tmp, target)  # atomic, and refuses a name that exists
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True

    def get_bytes(self, key: str) -> bytes | None:
        try:
            with open(self._path(key), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def list(self, prefix: str = "") -> list[str]:
        root = self.url.prefix
        out = []
        for dirpath, _, names in os.walk(self._path(prefix) if prefix else root):
            for name in names:
                if not is_partial(name) and not os.path.islink(os.path.join(dirpath, name)):
                    out.append(os.path.relpath(os.path.join(dirpath, name), root))
        return sorted(out)

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def upload_file(self, path: str, key: str) -> None:
        def fill(tmp: str) -> None:
            shutil.copyfile(path, tmp)

        self._write(key, fill)

    def download_file(self, key: str, path: str) -> None:
        shutil.copyfile(self._path(key), path)


class S3Store:
    """boto3; large files in parallel parts (TransferConfig)."""

    def __init__(self, url: StoreURL) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.url = url
        config = Config(connect_timeout=CONNECT_S, read_timeout=READ_S,
                        retries={"total_max_attempts": ATTEMPTS, "mode": "standard"})
        # endpoint: AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL
        self.client = boto3.client("s3", config=config)
        self.transfer = TransferConfig(multipart_threshold=PART_BYTES,
                                       multipart_chunksize=PART_BYTES, max_concurrency=THREADS)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.url.bucket, Key=_join(self.url, key), Body=data)

    def put_new(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.url.bucket, Key=_join(self.url, key), Body=data,
                                   IfNoneMatch="*")
        except ClientError as exc:
            # 412 PreconditionFailed: the key exists; 409 ConditionalRequestConflict: another
            # writer's conditional write of it is in flight (it wins)
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed",
                                                             "ConditionalRequestConflict"):
                return False
            raise
        return True

    def get_bytes(self, key: str) -> bytes | None:
        try:
            obj = self.client.get_object(Bucket=self.url.bucket, Key=_join(self.url, key))
        except self.client.exceptions.NoSuchKey:
            return None
        return bytes(obj["Body"].read())

    def list(self, prefix: str = "") -> list[str]:
        start = len(self.url.prefix) + 1 if self.url.prefix else 0
        out = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.url.bucket, Prefix=_folder(self.url, prefix))
        for page in pages:
            out += [str(obj["Key"])[start:] for obj in page.get("Contents", [])]
        return sorted(out)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.url.bucket, Key=_join(self.url, key))

    def upload_file(self, path: str, key: str) -> None:
        self.client.upload_file(path, self.url.bucket, _join(self.url, key),
                                Config=self.transfer)

    def download_file(self, key: str, path: str) -> None:
        self.client.download_file(self.url.bucket, _join(self.url, key), path,
                                  Config=self.transfer)


class GcsStore:
    """google-cloud-storage; STORAGE_EMULATOR_HOST reaches a local fake without credentials."""

    def __init__(self, url: StoreURL) -> None:
        from google.cloud import storage  # type: ignore[attr-defined]

        self.url = url
        if os.environ.get("STORAGE_EMULATOR_HOST"):
            from google.auth.credentials import AnonymousCredentials

            client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "mgpu-test"),
                                    credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
        else:
            client = storage.Client()
        self.bucket = client.bucket(url.bucket)
        from google.cloud.storage.retry import DEFAULT_RETRY

        # every call: (connect, read) timeouts, and retries for at most ATTEMPTS x READ_S
        self.bounds: dict[str, Any] = {"timeout": (CONNECT_S, READ_S),
                                       "retry": DEFAULT_RETRY.with_timeout(ATTEMPTS * READ_S)}

    def _blob(self, key: str) -> Any:
        return self.bucket.blob(_join(self.url, key), chunk_size=PART_BYTES)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._blob(key).upload_from_string(data, **self.bounds)

    def put_new(self, key: str, data: bytes) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        try:  # generation 0: only if no live object has the name
            self._blob(key).upload_from_string(data, if_generation_match=0, **self.bounds)
        except PreconditionFailed:
            return False
        return True

    def get_bytes(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return bytes(self._blob(key).download_as_bytes(**self.bounds))
        except NotFound:
            return None

    def list(self, prefix: str = "") -> list[str]:
        start = len(self.url.prefix) + 1 if self.url.prefix else 0
        blobs = self.bucket.list_blobs(prefix=_folder(self.url, prefix) or None, **self.bounds)
        return sorted(str(b.name)[start:] for b in blobs)

    def delete(self, key: str) -> None:
        from google.api_core.exceptions import NotFound

        try:
            self._blob(key).delete(**self.bounds)
        except NotFound:
            pass

    def upload_file(self, path: str, key: str) -> None:
        self._blob(key).upload_from_filename(path, **self.bounds)

    def download_file(self, key: str, path: str) -> None:
        self._blob(key).download_to_filename(path, **self.bounds)


def open_store(url: str | StoreURL) -> Store:
    parsed = parse_url(url) if isinstance(url, str) else url
    if parsed.scheme == "file":
        return FileStore(parsed)
    if parsed.scheme == "s3":
        return S3Store(parsed)
    return GcsStore(parsed)
