"""Poll the control plane's snapshot and keep the last good one, in memory and on disk.

The generic half of a snapshot consumer, shared by the regional agent (and
meant for the gateway, whose `gateway/snapshot_source.py` adds artifact
verification and its routing table on top):

    GET /api/v1/snapshot, If-None-Match: "snapshot-N" ──► 304  unchanged
                                                     └──► 200  validate → refuse if older → write cache (atomic) → current

A body that fails `RoutingSnapshot` validation or carries a lower version
than the one held is refused and the held one stays (invariant 7: the data
plane outlives the control plane). `load_cache()` at start-up serves the
last good snapshot before the control plane answers, or while it is away.
The cache is written off the event loop (a gateway serves streams on it), and
a failed write is logged, not raised: holding the newest snapshot matters more
than the disk copy.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum
from pathlib import Path

import httpx
from pydantic import ValidationError

from common.atomic_file import write_atomically
from common.logs import get_logger
from contract.snapshot import RoutingSnapshot, etag_for

log = get_logger(__name__)

SNAPSHOT_PATH = "/api/v1/snapshot"


class PollOutcome(StrEnum):
    APPLIED = "applied"
    UNCHANGED = "unchanged"
    REFUSED = "refused"
    UNREACHABLE = "unreachable"


class SnapshotClient:
    def __init__(self, http: httpx.AsyncClient, base_url: str, *, token: str | None = None,
                 cache_path: Path | None = None) -> None:
        self.http = http
        self.url = base_url.rstrip("/") + SNAPSHOT_PATH
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.cache_path = cache_path
        self.current: RoutingSnapshot | None = None
        self.last_refusal: str | None = None

    def load_cache(self) -> RoutingSnapshot | None:
        """The snapshot last written to disk, if there is a valid one."""
        if self.cache_path is None or not self.cache_path.exists():
            return None
        try:
            self.current = RoutingSnapshot.model_validate_json(self.cache_path.read_bytes())
        except (ValidationError, OSError) as exc:
            log.warning("snapshot cache unusable", path=str(self.cache_path), error=str(exc)[:200])
            return None
        return self.current

    async def poll(self) -> PollOutcome:
        headers = dict(self.headers)
        if self.current is not None:
            headers["If-None-Match"] = etag_for(self.current.version)
        try:
            response = await self.http.get(self.url, headers=headers)
        except httpx.TransportError as exc:
            log.info("control plane unreachable; keeping the last good snapshot", error=type(exc).__name__)
            return PollOutcome.UNREACHABLE
        if response.status_code == 304:
            return PollOutcome.UNCHANGED
        if response.status_code != 200:
            log.info("snapshot not served", status=response.status_code)
            return PollOutcome.UNREACHABLE
        try:
            snapshot = RoutingSnapshot.model_validate_json(response.content)
        except ValidationError as exc:
            return self._refuse(f"invalid snapshot: {str(exc)[:300]}")
        if self.current is not None and snapshot.version < self.current.version:
            return self._refuse(f"snapshot {snapshot.version} is older than the applied {self.current.version}")
        if self.cache_path is not None:
            try:
                await asyncio.to_thread(write_atomically, self.cache_path, response.content)
            except OSError as exc:
                log.error("cannot write the snapshot to disk", path=str(self.cache_path), error=str(exc))
        self.current = snapshot
        self.last_refusal = None
        return PollOutcome.APPLIED

    def _refuse(self, reason: str) -> PollOutcome:
        log.error("snapshot refused", reason=reason)
        self.last_refusal = reason
        return PollOutcome.REFUSED
