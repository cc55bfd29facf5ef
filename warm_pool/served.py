"""Real traffic as a probe: when each endpoint last served a request successfully, from the gateways' reports.

`GET /api/v1/gateways?region=R` returns every replica's last report
(`contract.events.GatewayReport`); an endpoint's `served_ok_at` is the
newest success any replica saw. The budget (`warm_pool/budget.py`) counts it
as a canary, so busy instances are not probed at all. Reports older than the
control plane's staleness limit say nothing about the present and are skipped.
"""

from __future__ import annotations

from datetime import datetime

import httpx
from pydantic import ValidationError

from common.logs import get_logger
from contract.events import GatewayReport

log = get_logger(__name__)

GATEWAYS_PATH = "/api/v1/gateways"


async def served_recently(http: httpx.AsyncClient, base_url: str, *, region: str,
                          token: str | None = None) -> dict[str, datetime]:
    """instance id → the newest successful request any gateway replica of `region` reported."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = await http.get(base_url.rstrip("/") + GATEWAYS_PATH, params={"region": region}, headers=headers)
    except httpx.TransportError:
        return {}
    if response.status_code != 200:
        return {}
    body = response.json()
    rows = body.get("gateways", []) if isinstance(body, dict) else body  # the stand-in wraps the list
    newest: dict[str, datetime] = {}
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or row.get("stale") or row.get("region") != region:
            continue
        try:
            report = GatewayReport.model_validate({k: v for k, v in row.items() if k in GatewayReport.model_fields})
        except ValidationError as exc:
            log.info("gateway report unreadable", error=str(exc)[:200])
            continue
        for endpoint in report.live_endpoints:
            at = endpoint.served_ok_at
            if at is not None and (endpoint.instance_id not in newest or at > newest[endpoint.instance_id]):
                newest[endpoint.instance_id] = at
    return newest
