"""Where artifacts live: a filesystem directory or an S3 prefix.

A location string picks the store: `s3://bucket/prefix` is S3 (boto3,
with `endpoint_url` for S3-compatible servers), anything else is a local
directory. Paths inside a store are POSIX-style and relative to its root.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from weight_catalog.errors import ArtifactStoreUnavailable, InvalidArtifact, InvalidLocation

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


def _describe(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return kind
    return "special file"


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "a symlink loop"
    if exc.errno == errno.ENOENT:
        return "a dangling symlink or a file that vanished"
    if exc.errno == errno.ENAMETOOLONG:
        return "a name too long for the filesystem (over 255 bytes per component)"
    return exc.strerror or type(exc).__name__


def resolve_directory(location: str | Path) -> Path:
    """The absolute, symlink-free path of a location, or InvalidLocation (never OSError/RuntimeError)."""
    try:
        root = Path(location).resolve(strict=True)
        is_dir = root.is_dir()
    except RuntimeError as exc:  # Python 3.11's Path.resolve reports a loop this way
        raise InvalidLocation(f"{location}: a symlink loop") from exc
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise InvalidLocation(f"{location} is not a directory") from exc
        raise InvalidLocation(f"{location}: {_os_reason(exc)}") from exc
    if not is_dir:
        raise InvalidLocation(f"{root} is not a directory")
    return root


class FilesystemStore:
    """A local directory. Only regular files (or symlinks to them) are listed, opened or hashed.

    Anything else under the root is refused with a typed 422
    (`invalid_artifact`) naming the path, never hashed and never opened: a
    FIFO blocks `open()` forever, a dangling symlink or loop raises, a
    symlinked directory would be skipped silently. Files are opened with
    O_NONBLOCK and checked with fstat, so a file swapped for a FIFO after
    listing is refused too rather than hanging the hash.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = resolve_directory(root)
        self.location = str(self.root)

    def _walk_error(self, exc: OSError) -> None:
        raise InvalidArtifact(f"{exc.filename}: {_os_reason(exc)}") from exc

    def list_files(self) -> dict[str, int]:
        files: dict[str, int] = {}
        for dirpath, dirnames, filenames in os.walk(self.root, onerror=self._walk_error):
            for name in dirnames:
                if not name.startswith(".") and os.path.islink(os.path.join(dirpath, name)):
                    rel = (Path(dirpath) / name).relative_to(self.root).as_posix()
                    raise InvalidArtifact(f"{rel} is a symlink to a directory; only regular files are hashed")
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in filenames:
                if name.startswith("."):
                    continue
                full = Path(dirpath) / name
                rel = full.relative_to(self.root).as_posix()
                try:
                    info = full.stat()
                except OSError as exc:
                    raise InvalidArtifact(f"{rel}: {_os_reason(exc)}") from exc
                if not stat.S_ISREG(info.st_mode):
                    raise InvalidArtifact(f"{rel} is a {_describe(info.st_mode)}; only regular files are hashed")
                files[rel] = info.st_size
        return dict(sorted(files.items()))

    def _resolve(self, path: str) -> Path:
        try:
            full = (self.root / path).resolve()
        except RuntimeError as exc:
            raise InvalidArtifact(f"{path}: a symlink loop") from exc
        except OSError as exc:
            raise InvalidArtifact(f"{path}: {_os_reason(exc)}") from exc
        if not full.is_relative_to(self.root):
            raise InvalidLocation(f"{path!r} escapes the artifact root")
        return full

    def open(self, path: str) -> BinaryIO:
        full = self._resolve(path)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidArtifact(f"{path}: {_os_reason(exc)}") from exc
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise InvalidArtifact(f"{path} is a {_describe(mode)}; only regular files are hashed")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        # Unbuffered: readinto fills our 8 MiB buffer straight from the kernel.
        return os.fdopen(fd, "rb", buffering=0)

    def read_text(self, path: str) -> str | None:
        full = self._resolve(path)
        if not os.path.lexists(full):
            return None
        with self.open(path) as stream:
            data = stream.read()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArtifact(f"{path} is not UTF-8 text") from exc


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
    try:
        resolved = Path(location).resolve()  # not strict: say "outside" before "missing", so nothing is probed
    except (OSError, RuntimeError) as exc:
        raise InvalidLocation(f"{location!r} cannot be resolved (a symlink loop or a name too long)") from exc
    if not any(resolved.is_relative_to(Path(root).resolve()) for root in roots):
        raise InvalidLocation(
            f"{location!r} is outside LIFELINE_CONTROLPLANE_ARTIFACT_ROOTS; register it with `lifeline catalog register`"
        )
