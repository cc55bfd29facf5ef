"""Load a weight version's tokenizer and chat template from the catalog's artifact location, verified.

The snapshot names, for each version, where its artifacts are (`location`:
a directory or `s3://bucket/prefix`) and the sha256 of each file a gateway
loads (`VersionEntry.files`). The gateway reads each file's bytes once,
hashes those bytes and parses the *same* bytes, so a file swapped between
check and use cannot slip in. A version is routable only when every file it
needs is listed and matches; anything else is `ArtifactVerificationFailed`,
and the snapshot table leaves that version out (a miss, never a misuse).

    needed: tokenizer.json (tokenize), config.json (context length)
    optional: tokenizer_config.json (chat template), loaded only if listed

For `s3://` locations the verified bytes are also written under
`routing.artifact_dir`; when S3 cannot be read, that copy is read instead and
verified against the snapshot's checksums all the same (a restart during an
S3 outage still loads the tokenizer).

Loading happens off the event loop (the poller calls it in a thread) and
once per (version, checksums): a later snapshot with the same version reuses
the loaded tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from common.errors import LifelineError
from common.logs import get_logger
from contract.snapshot import VersionEntry
from common.atomic_file import write_atomically

log = get_logger(__name__)

REQUIRED_FILES = ("tokenizer.json", "config.json")
OPTIONAL_FILES = ("tokenizer_config.json",)


class ArtifactVerificationFailed(LifelineError):
    """A version's artifacts are missing, unlisted, unreadable or do not match their sha256."""

    error_type = "artifact_verification_failed"


@dataclass(frozen=True)
class LoadedArtifacts:
    version: str
    model_dir: Path  # where the verified files are (the location itself, or the S3 download)
    tokenizer: Tokenizer
    chat_template: str | None
    max_model_len: int
    files: tuple[tuple[str, str], ...]  # (name, sha256) as verified


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _expected(entry: VersionEntry) -> dict[str, str]:
    missing = [name for name in REQUIRED_FILES if name not in entry.files]
    if missing:
        raise ArtifactVerificationFailed(
            f"version {entry.version!r}: the snapshot lists no sha256 for {', '.join(missing)}; "
            "an unverifiable tokenizer is never loaded")
    wanted = REQUIRED_FILES + tuple(name for name in OPTIONAL_FILES if name in entry.files)
    return {name: entry.files[name].removeprefix("sha256:").lower() for name in wanted}


class ArtifactLoader:
    """Verified tokenizers by version; thread-safe, cached by (version, checksums)."""

    def __init__(self, *, download_dir: Path, s3_endpoint_url: str | None = None, s3_client: Any = None) -> None:
        self.download_dir = download_dir
        self.s3_endpoint_url = s3_endpoint_url
        self._s3 = s3_client
        self._cache: dict[tuple[str, tuple[tuple[str, str], ...]], LoadedArtifacts] = {}
        self._lock = threading.Lock()

    def cached(self, entry: VersionEntry) -> LoadedArtifacts | None:
        try:
            key = (entry.version, tuple(sorted(_expected(entry).items())))
        except ArtifactVerificationFailed:
            return None
        return self._cache.get(key)

    def retain(self, versions: set[str]) -> None:
        """Forget loaded tokenizers of versions no longer in the snapshot (they load again if they return)."""
        with self._lock:
            self._cache = {key: loaded for key, loaded in self._cache.items() if key[0] in versions}

    def load(self, entry: VersionEntry) -> LoadedArtifacts:
        """The version's verified tokenizer, template and context length; ArtifactVerificationFailed if not."""
        expected = _expected(entry)
        key = (entry.version, tuple(sorted(expected.items())))
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        blobs, model_dir = self._read(entry, list(expected))
        for name, digest in expected.items():
            actual = _sha256(blobs[name])
            if actual != digest:
                raise ArtifactVerificationFailed(
                    f"version {entry.version!r}: {name} has sha256 {actual[:16]}…, the snapshot says {digest[:16]}…")
        if entry.location.startswith("s3://"):
            # A verified copy on disk, so an operator can see what this gateway tokenizes with.
            for name, data in blobs.items():
                write_atomically(model_dir / name, data)
        try:
            tokenizer = Tokenizer.from_str(blobs["tokenizer.json"].decode())
            config = json.loads(blobs["config.json"])
            max_model_len = int(config["max_position_embeddings"])
            template = None
            if "tokenizer_config.json" in blobs:
                template = json.loads(blobs["tokenizer_config.json"]).get("chat_template")
        except Exception as exc:  # verified bytes that still do not parse: not routable either
            raise ArtifactVerificationFailed(f"version {entry.version!r}: artifacts do not load: {exc!r}"[:500]) from None
        loaded = LoadedArtifacts(entry.version, model_dir, tokenizer, template, max_model_len,
                                 tuple(sorted(expected.items())))
        with self._lock:
            self._cache[key] = loaded
        log.info("artifacts verified", version=entry.version, location=entry.location, files=len(expected))
        return loaded

    def _read(self, entry: VersionEntry, names: list[str]) -> tuple[dict[str, bytes], Path]:
        if entry.location.startswith("s3://"):
            return self._read_s3(entry, names)
        root = Path(entry.location.removeprefix("file://"))
        blobs = {}
        for name in names:
            try:
                blobs[name] = (root / name).read_bytes()
            except OSError as exc:
                raise ArtifactVerificationFailed(f"version {entry.version!r}: cannot read {root / name}: {exc}") from None
        return blobs, root

    def _read_s3(self, entry: VersionEntry, names: list[str]) -> tuple[dict[str, bytes], Path]:
        bucket, _, prefix = entry.location.removeprefix("s3://").partition("/")
        if self._s3 is None:
            import boto3  # only when a location is on S3

            self._s3 = boto3.client("s3", endpoint_url=self.s3_endpoint_url)
        local = self.download_dir / entry.version
        blobs = {}
        for name in names:
            key = f"{prefix.rstrip('/')}/{name}" if prefix else name
            try:
                blobs[name] = self._s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            except Exception as exc:  # botocore's ClientError and transport errors alike
                if all((local / n).is_file() for n in names):
                    # S3 away (a region-wide outage, say): the copy verified last time is checked again below.
                    log.warning("S3 unreadable; verifying the local copy", version=entry.version, error=str(exc)[:200])
                    return {n: (local / n).read_bytes() for n in names}, local
                raise ArtifactVerificationFailed(f"version {entry.version!r}: cannot read s3://{bucket}/{key}: {exc}"[:500]) from None
        return blobs, local
