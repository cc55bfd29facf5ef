"""Where artifacts live: a filesystem directory or an S3 prefix.

A location string picks the store: `s3://bucket/prefix` is S3 (boto3,
with `endpoint_url` for S3-compatible servers), anything else is a local
directory. Paths inside a store are POSIX-style and relative to its root.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from weight_catalog.errors import ArtifactStoreUnavailable, InvalidLocation

BUCKET_PATTERN = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@contextmanager
def _s3_errors(location: str) -> Iterator[None]:
    """Client errors are the caller's (422); transport errors are the store's (503)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        raise InvalidLocation(f"{location}: S3 said {code}") from exc
    except BotoCoreError as exc:
        raise ArtifactStoreUnavailable(f"{location}: {exc}") from exc


class ArtifactStore(Protocol):
    location: str

    def list_files(self) -> dict[str, int]:
        """Relative path → size in bytes, for every file under the root."""
        ...

    def open(self, path: str) -> BinaryIO: ...

    def read_text(self, path: str) -> str | None:
        """A small file's text, or None if it does not exist."""
        ...


class FilesystemStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self.location = str(self.root)
        if not self.root.is_dir():
            raise InvalidLocation(f"{self.root} is not a directory")

    def list_files(self) -> dict[str, int]:
        files: dict[str, int] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in filenames:
                if name.startswith("."):
                    continue
                full = Path(dirpath) / name
                files[full.relative_to(self.root).as_posix()] = full.stat().st_size
        return dict(sorted(files.items()))

    def _resolve(self, path: str) -> Path:
        full = (self.root / path).resolve()
        if not full.is_relative_to(self.root):
            raise InvalidLocation(f"{path!r} escapes the artifact root")
        return full

    def open(self, path: str) -> BinaryIO:
        # Unbuffered: readinto fills our 8 MiB buffer straight from the kernel.
        return open(self._resolve(path), "rb", buffering=0)  # noqa: SIM115

    def read_text(self, path: str) -> str | None:
        full = self._resolve(path)
        if not full.is_file():
            return None
        return full.read_text(encoding="utf-8")


class S3Store:
    def __init__(self, bucket: str, prefix: str, client: Any) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client
        self.location = f"s3://{bucket}/{self.prefix}"

    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    def list_files(self) -> dict[str, int]:
        files: dict[str, int] = {}
        start = f"{self.prefix}/" if self.prefix else ""
        paginator = self.client.get_paginator("list_objects_v2")
        with _s3_errors(self.location):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=start):
                for obj in page.get("Contents", []):
                    rel = obj["Key"][len(start):]
                    if rel and not rel.endswith("/"):
                        files[rel] = int(obj["Size"])
        return dict(sorted(files.items()))

    def open(self, path: str) -> BinaryIO:
        with _s3_errors(self.location):
            return self.client.get_object(Bucket=self.bucket, Key=self._key(path))["Body"]

    def read_text(self, path: str) -> str | None:
        with _s3_errors(self.location):
            try:
                body = self.client.get_object(Bucket=self.bucket, Key=self._key(path))["Body"]
            except self.client.exceptions.NoSuchKey:
                return None
            with body:
                return body.read().decode("utf-8")


def s3_client(endpoint_url: str | None = None) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"})
    return boto3.client("s3", endpoint_url=endpoint_url, config=config)


def open_store(location: str, *, s3_endpoint_url: str | None = None, s3: Any = None) -> ArtifactStore:
    if location.startswith("s3://"):
        bucket, _, prefix = location.removeprefix("s3://").partition("/")
        if not BUCKET_PATTERN.match(bucket):
            raise InvalidLocation(f"{location!r} does not name a valid S3 bucket")
        return S3Store(bucket, prefix, s3 if s3 is not None else s3_client(s3_endpoint_url))
    if "://" in location:
        raise InvalidLocation(f"{location!r}: only directories and s3:// prefixes are supported")
    return FilesystemStore(location)


def check_readable_by_api(location: str, roots: Sequence[Path]) -> None:
    """Refuse filesystem locations outside the configured artifact roots."""
    if location.startswith("s3://"):
        return
    resolved = Path(location).resolve()
    if not any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
        raise InvalidLocation(
            f"{location!r} is outside LIFELINE_ARTIFACT_ROOTS; register it with `lifeline catalog register`"
        )
