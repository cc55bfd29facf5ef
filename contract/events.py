"""What the data plane reports to the control plane: applied snapshots and automatic L7 actions.

Gateways (and later regional agents) send these to the control plane over
HTTP, in the background and in batches; never on a request's path. The
control plane stores events in its append-only event log with the same
`routing_tier` label its own cutovers carry, so a post-mortem can tell a
gateway's automatic removal (`actor="gateway:<replica>"`) from an operator's
cutover.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_BATCH = 500


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataPlaneEvent(_Record):
    """One automatic routing action a data-plane process took on its own."""

    kind: Literal["instance.suppressed", "instance.readmitted", "generation.fenced", "snapshot.refused",
                  # the regional agent: a probe verdict changed; the pool promoted, started, lost or stopped one
                  "probe.verdict", "pool.promoted", "pool.started", "pool.lost", "pool.stopped"]
    routing_tier: Literal["l7", "mesh", "anycast", "dns"] = "l7"
    actor: str = Field(min_length=1, max_length=160, description="gateway:<replica> or agent:<region>")
    region: str = Field(min_length=1, max_length=128)
    instance_id: str | None = Field(None, max_length=200)
    generation: int | None = None
    reason: str = Field(max_length=2000)
    at: datetime
    detail: dict[str, str | int | float | bool | None] = Field(default_factory=dict)


class EventBatch(_Record):
    events: list[DataPlaneEvent] = Field(max_length=MAX_BATCH)
    dropped: int = Field(0, ge=0, description="events the sender dropped since its last batch (buffer full)")


class LiveEndpoint(_Record):
    instance_id: str
    generation: int | None
    version: str
    zone: str
    # when a request on this endpoint last finished successfully; the regional agent counts it as a probe
    served_ok_at: datetime | None = None


class GatewayReport(_Record):
    """A gateway replica's state as it sees it; `PUT /api/v1/gateways/{replica_id}`."""

    replica_id: str = Field(min_length=1, max_length=160)
    region: str = Field(min_length=1, max_length=128)
    zone: str = Field(max_length=128)
    snapshot_version: int | None = Field(None, description="the snapshot applied; None while routing from static config")
    snapshot_applied_at: datetime | None = None
    routing_source: Literal["static", "snapshot"]
    live_endpoints: list[LiveEndpoint] = Field(default_factory=list, max_length=10_000)
    suppressed: int = Field(0, ge=0)
    ejected: int = Field(0, ge=0)
    reported_at: datetime
