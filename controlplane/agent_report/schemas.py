from __future__ import annotations

from datetime import datetime

from pydantic import Field

from contract.events import AgentReport


class AgentReportRead(AgentReport):
    """A stored report and how old it is. A `stale` report says nothing about the region's present."""

    received_at: datetime
    reported_by: str
    age_s: float = Field(description="seconds since the control plane received it")
    stale: bool = Field(description="older than the staleness limit: the agent may be gone or cut off")
    foreign_epoch: bool = Field(description="its snapshot came from another control-plane database (epoch): "
                                "its version says nothing about this one's")
