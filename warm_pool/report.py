"""Send the agent's view of its region to the control plane: `PUT /api/v1/agents/{region}`, on the agent's loop.

The report (`contract.events.AgentReport`) is a whole picture, not a delta:
each one replaces the last, so a lost one costs nothing but freshness and
nothing is buffered or retried. The control plane marks a report stale
when none arrived within its limit, so an agent that is cut off is never
shown as the region's present. Never on a request's path.
"""

from __future__ import annotations

import httpx

from common.logs import get_logger
from contract.events import AgentReport

log = get_logger(__name__)

AGENTS_PATH = "/api/v1/agents"


class ReportSender:
    def __init__(self, http: httpx.AsyncClient | None, base_url: str | None, *, token: str | None = None) -> None:
        self.http = http
        self.base_url = base_url.rstrip("/") if base_url else None
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def send(self, report: AgentReport) -> str:
        """Put `report`; the outcome (a metric label): sent, refused, unreachable or disabled."""
        if self.http is None or self.base_url is None:
            return "disabled"
        try:
            response = await self.http.put(f"{self.base_url}{AGENTS_PATH}/{report.region}",
                                           # no staging check, no key: a control plane older than the
                                           # field (its record forbids extras) takes the report as before
                                           content=report.model_dump_json(
                                               exclude={"staging"} if report.staging is None else None),
                                           headers={**self.headers, "Content-Type": "application/json"})
        except httpx.TransportError as exc:
            log.info("agent report not sent; the next one replaces it", error=type(exc).__name__)
            return "unreachable"
        if response.status_code >= 300:
            log.warning("control plane refused the agent report", status=response.status_code,
                        body=response.text[:300])
            return "refused"
        return "sent"
