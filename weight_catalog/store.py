"""Where artifacts live: a filesystem directory or an S3 prefix.

A location string picks the store: `s3://bucket/prefix` is S3 (boto3,
with `endpoint_url` for S3-compatible servers), anything else is a local
directory. Paths inside a store are POSIX-style and relative to its root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from weight_catalog.errors import InvalidLocation


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
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=start):
                for obj in page.get("Contents", []):
                    rel = obj["Key"][len(start):]
                    if rel and not rel.endswith("/"):
                        files[rel] = int(obj["Size"])
        except self.client.exceptions.NoSuchBucket as exc:
            raise InvalidLocation(f"bucket {self.bucket!r} does not exist") from exc
        return dict(sorted(files.items()))

    def open(self, path: str) -> BinaryIO:
        return self.client.get_object(Bucket=self.bucket, Key=self._key(path))["Body"]

    def read_text(self, path: str) -> str | None:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(path))["Body"]
        except self.client.exceptions.NoSuchKey:
            return None
        with body:
            return body.read().decode("utf-8")


def s3_client(endpoint_url: str | None = None) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint_url)


def open_store(location: str, *, s3_endpoint_url: str | None = None, s3: Any = None) -> ArtifactStore:
    if location.startswith("s3://"):
        bucket, _, prefix = location.removeprefix("s3://").partition("/")
        if not bucket:
            raise InvalidLocation(f"{location!r} names no bucket")
        return S3Store(bucket, prefix, s3 if s3 is not None else s3_client(s3_endpoint_url))
    if "://" in location:
        raise InvalidLocation(f"{location!r}: only directories and s3:// prefixes are supported")
    return FilesystemStore(location)
