from __future__ import annotations

from datetime import datetime

from pydantic import Field

from contract.events import GatewayReport


class GatewayReportRead(GatewayReport):
    """A stored report and how old it is. `stale` reports say nothing about the present."""

    received_at: datetime
    reported_by: str
    age_s: float = Field(description="seconds since the control plane received it")
    stale: bool = Field(description="older than the staleness limit: the replica may be gone or cut off")
    foreign_epoch: bool = Field(
        False, description="its snapshot came from another control-plane database (another epoch, or none): "
                           "its snapshot_version says nothing about this one's")
