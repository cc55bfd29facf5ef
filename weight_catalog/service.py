"""Weight versions: scan an artifact, register it, read it back.

Functions take keyword-only arguments, never commit, and raise typed
errors from `weight_catalog.errors`. Hashing happens before any database
work (`scan_artifact`), so a long hash never holds a transaction open.
The rest of the catalog's logic is split by concern: `verify` (re-hash
and record the result), `known_issues`, `aliases` (promote, rollback).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from common.clock import Clock
from controlplane.event import service as event_service
from weight_catalog import repository
from weight_catalog.errors import InvalidArtifact, VersionExists, VersionNotFound
from weight_catalog.fingerprint import fingerprint, fingerprint_parts
from weight_catalog.hashing import DEFAULT_BLOCK_BYTES, Progress, ShardDigest, hash_shards
from weight_catalog.models import Shard, WeightVersion
from weight_catalog.store import ArtifactStore

REQUIRED_FILES = ("config.json", "tokenizer.json")


@dataclass(frozen=True)
class ArtifactScan:
    location: str
    shards: list[ShardDigest]
    total_bytes: int
    fingerprint_parts: dict[str, str]
    fingerprint: str


def scan_artifact(
    store: ArtifactStore,
    *,
    workers: int = 4,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: Progress | None = None,
    files: dict[str, int] | None = None,
) -> ArtifactScan:
    """Hash every file of an artifact and compute its semantic fingerprint."""
    files = files if files is not None else store.list_files()
    missing = [name for name in REQUIRED_FILES if name not in files]
    if missing:
        raise InvalidArtifact(f"{store.location} has no {', '.join(missing)}")
    parts = fingerprint_parts(lambda name: store.read_text(name) if name in files else None)
    shards = hash_shards(store, list(files), workers=workers, block_bytes=block_bytes, progress=progress)
    return ArtifactScan(
        location=store.location,
        shards=shards,
        total_bytes=sum(s.size for s in shards),
        fingerprint_parts=parts,
        fingerprint=fingerprint(parts),
    )


def get_version_or_raise(session: Session, *, model: str, version: str) -> WeightVersion:
    found = repository.get_version(session, model=model, version=version)
    if found is None:
        raise VersionNotFound(f"model {model!r} has no version {version!r}")
    return found


def ensure_version_absent(session: Session, *, model: str, version: str) -> None:
    if repository.get_version(session, model=model, version=version) is not None:
        raise VersionExists(f"model {model!r} already has a version {version!r}")


def list_versions(session: Session, *, model: str | None = None) -> Sequence[WeightVersion]:
    return repository.list_versions(session, model=model)


def create_version(
    session: Session, *, model: str, version: str, scan: ArtifactScan, actor: str, clock: Clock
) -> WeightVersion:
    ensure_version_absent(session, model=model, version=version)
    weight_version = WeightVersion(
        model=model,
        version=version,
        location=scan.location,
        total_bytes=scan.total_bytes,
        fingerprint=scan.fingerprint,
        fingerprint_parts=scan.fingerprint_parts,
        registered_by=actor,
        registered_at=clock.utcnow(),
        shards=[Shard(path=s.path, size=s.size, sha256=s.sha256) for s in scan.shards],
    )
    session.add(weight_version)
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError as exc:
        raise VersionExists(f"model {model!r} already has a version {version!r}") from exc
    event_service.record(
        session,
        kind="catalog.version.register",
        actor=actor,
        reason="",
        scope=f"model:{model}/version:{version}",
        after={"version": version, "fingerprint": scan.fingerprint, "total_bytes": scan.total_bytes},
        clock=clock,
    )
    return weight_version


def expected_shards(session: Session, *, model: str, version: str) -> list[ShardDigest]:
    """What the catalog recorded for a version, detached from the session."""
    weight_version = get_version_or_raise(session, model=model, version=version)
    return [ShardDigest(path=s.path, size=s.size, sha256=s.sha256) for s in weight_version.shards]
