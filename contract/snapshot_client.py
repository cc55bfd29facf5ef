"""Poll the control plane's snapshot and keep the last good one, in memory and on disk.

The generic half of a snapshot consumer, shared by the regional agent (and
meant for the gateway, whose `gateway/snapshot_source.py` adds artifact
verification and its routing table on top):

    GET /api/v1/snapshot, If-None-Match: "snapshot-E-N" ──► 304  unchanged
                                                       └──► 200  validate → refusal()? → write cache (atomic) → current

A body that fails `RoutingSnapshot` validation, or carries a lower version
than the one held *from the same control-plane epoch*, is refused and the
held one stays (invariant 7: the data plane outlives the control plane).
Versions count up within one control-plane database only, so a snapshot
from another epoch (the gateway was pointed at a fresh database, or one
restored from backup and rotated) is taken whatever its version, and
replaces the cache on disk: refusing it would pin the consumer to a
database that no longer serves it, for as long as the new one takes to
count past the old one's versions. See `refusal` for the whole table.
`load_cache()` at start-up serves the
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


def refusal(held: RoutingSnapshot | None, offered: RoutingSnapshot) -> str | None:
    """None if `offered` may replace `held`; else why not.

        held       offered                      verdict
        nothing    anything valid               take it
        epoch E    epoch E,  version >= held    take it (equal: the same content again)
        epoch E    epoch E,  version <  held    refuse: an older snapshot of the same database
        epoch E    epoch F,  any version        take it: another database; its versions are its own
        no epoch   epoch E (or the reverse)     take it: a control plane from before epochs is an epoch of its own

    Taking another epoch's snapshot means following whichever control plane
    answers; the consumer cannot tell a planned move from two control planes
    behind one address, so it logs every epoch change and reports the epoch
    it applied (`GatewayReport.snapshot_epoch`), where the control plane
    shows a report from another epoch as foreign.
    """
    if held is None or held.controlplane_epoch != offered.controlplane_epoch:
        return None
    if offered.version < held.version:
        return f"snapshot {offered.version} is older than the applied {held.version} (epoch {held.controlplane_epoch})"
    return None


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
            headers["If-None-Match"] = etag_for(self.current.version, self.current.controlplane_epoch)
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
        if (why := refusal(self.current, snapshot)) is not None:
            return self._refuse(why)
        if self.current is not None and self.current.controlplane_epoch != snapshot.controlplane_epoch:
            log.warning("snapshot from another control-plane epoch; its versions restart", held=self.current.version,
                        held_epoch=self.current.controlplane_epoch, version=snapshot.version,
                        epoch=snapshot.controlplane_epoch)
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
