"""Verify a version: re-hash its files and recompute its semantic fingerprint.

A version is healthy only if every recorded file is present with its
recorded sha256 and size *and* every semantic part recomputed from the
files now there equals the recorded one: a `generation_config.json` or
`chat_template.jinja` that appeared after registration changes behaviour
although no recorded file changed. Extra files are listed; they count only
through the fingerprint. The result is recorded on the version
(`record_verify`), and a version whose last verify failed is not promoted
without force (`aliases`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import update
from sqlalchemy.orm import Session

from common.clock import Clock
from controlplane.event import service as event_service
from weight_catalog.errors import InvalidArtifact
from weight_catalog.fingerprint import fingerprint_parts
from weight_catalog.hashing import DEFAULT_BLOCK_BYTES, Progress, ShardDigest, hash_shards
from weight_catalog.models import WeightVersion
from weight_catalog.schemas import ShardMismatch, VerifyReport
from weight_catalog.service import get_version_or_raise
from weight_catalog.store import ArtifactStore


def verify(
    session: Session,
    *,
    model: str,
    version: str,
    store: ArtifactStore,
    workers: int = 4,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: Progress | None = None,
) -> VerifyReport:
    """Re-hash the version at `store` (a session held throughout: for tests and small artifacts)."""
    found = get_version_or_raise(session, model=model, version=version)
    expected = [ShardDigest(path=s.path, size=s.size, sha256=s.sha256) for s in found.shards]
    return verify_against(
        model=model, version=version, expected=expected, expected_parts=dict(found.fingerprint_parts),
        store=store, workers=workers, block_bytes=block_bytes, progress=progress,
    )


def fingerprint_drift(store: ArtifactStore, present: dict[str, int], expected_parts: dict[str, str]) -> list[str]:
    """The recorded semantic parts that the files now at `store` no longer produce.

    Only parts the version recorded are compared: a version registered
    before a part was added to the fingerprint is not failed for lacking it.
    """
    try:
        actual = fingerprint_parts(lambda name: store.read_text(name) if name in present else None)
    except InvalidArtifact:  # a semantic file no longer parses: every part is in doubt
        return sorted(expected_parts)
    return sorted(part for part, digest in expected_parts.items() if actual.get(part) != digest)


def verify_against(
    *,
    model: str,
    version: str,
    expected: Sequence[ShardDigest],
    expected_parts: dict[str, str],
    store: ArtifactStore,
    workers: int = 4,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    progress: Progress | None = None,
) -> VerifyReport:
    """Compare `store` with what was recorded; touches no database, so none is held while hashing."""
    by_path = {s.path: s for s in expected}
    present = store.list_files()
    missing = sorted(p for p in by_path if p not in present)
    unexpected = sorted(p for p in present if p not in by_path)
    to_hash = sorted(p for p in by_path if p in present)
    digests = hash_shards(store, to_hash, workers=workers, block_bytes=block_bytes, progress=progress)
    mismatched = [
        ShardMismatch(
            path=d.path,
            expected_sha256=by_path[d.path].sha256,
            actual_sha256=d.sha256,
            expected_size=by_path[d.path].size,
            actual_size=d.size,
        )
        for d in digests
        if d.sha256 != by_path[d.path].sha256 or d.size != by_path[d.path].size
    ]
    drift = fingerprint_drift(store, present, expected_parts)
    return VerifyReport(
        model=model,
        version=version,
        location=store.location,
        healthy=not (mismatched or missing or drift),
        checked=len(digests),
        mismatched=mismatched,
        missing=missing,
        unexpected=unexpected,
        fingerprint_drift=drift,
    )


def record_verify(session: Session, *, report: VerifyReport, actor: str, clock: Clock) -> WeightVersion:
    """Store the outcome on the version and write a `catalog.version.verify` event."""
    found = get_version_or_raise(session, model=report.model, version=report.version)
    now = clock.utcnow()
    session.execute(
        update(WeightVersion)
        .where(WeightVersion.id == found.id)
        .values(last_verified_at=now, last_verify_healthy=report.healthy, last_verify_location=report.location)
        .execution_options(synchronize_session=False)
    )
    session.refresh(found)
    event_service.record(
        session,
        kind="catalog.version.verify",
        actor=actor,
        reason="",
        scope=f"model:{report.model}/version:{report.version}",
        after={
            "healthy": report.healthy, "location": report.location, "mismatched": len(report.mismatched),
            "missing": len(report.missing), "fingerprint_drift": report.fingerprint_drift,
        },
        outcome="succeeded" if report.healthy else "failed",
        clock=clock,
    )
    return found
