"""One POST from the agent to the control plane, answered as an outcome the caller can act on.

The agent reports faults (`POST /api/v1/cutover-escalations`) and failed canaries
(`…/aliases/{alias}/canary-failures`) from background tasks, never its probe loop; both read the
answer the same way: `accepted` (2xx, with its JSON if any), `retry` (unreachable, a timeout, 5xx,
408 or 429: sent again later), `refused` (any other 4xx: given up, and said so), `disabled` (no
control plane configured).
"""

from __future__ import annotations

from typing import Any

RETRY_STATUSES = frozenset({408, 429})  # and every 5xx


class ControlPlanePoster:
    def __init__(self, http: Any, base_url: str | None, *, token: str | None = None, timeout_s: float) -> None:
        self.http = http
        self.base_url = base_url.rstrip("/") if base_url else None
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s

    async def post(self, path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any] | str | None]:
        """(outcome, the control plane's answer or why not)."""
        import httpx

        if self.http is None or self.base_url is None:
            return "disabled", None
        try:
            response = await self.http.post(f"{self.base_url}{path}", json=body, headers=self.headers,
                                            timeout=httpx.Timeout(connect=2.0, read=self.timeout_s, write=2.0,
                                                                  pool=2.0))
        except httpx.TransportError as exc:
            return "retry", type(exc).__name__
        if response.is_success:
            try:
                return "accepted", response.json()
            except ValueError:
                return "accepted", None
        if response.status_code >= 500 or response.status_code in RETRY_STATUSES:
            return "retry", f"HTTP {response.status_code}: {response.text[:300]}"
        return "refused", f"HTTP {response.status_code}: {response.text[:300]}"
