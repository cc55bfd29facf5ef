"""Ship the agent's DataPlaneEvents to the control plane in the background, in bounded batches.

`emit()` never blocks and never fails: the buffer holds `capacity` events,
the oldest are dropped beyond that and counted in the next batch's
`dropped`. `flush()` posts up to `MAX_BATCH` events to `POST
/api/v1/events/dataplane`; on any failure they stay buffered for the next
flush. The agent keeps working while the control plane is away.
"""

from __future__ import annotations

from collections import deque

import httpx

from common.logs import get_logger
from contract.events import MAX_BATCH, DataPlaneEvent, EventBatch

log = get_logger(__name__)

EVENTS_PATH = "/api/v1/events/dataplane"


class EventShipper:
    def __init__(self, http: httpx.AsyncClient | None, base_url: str | None, *, token: str | None = None,
                 capacity: int = 10_000) -> None:
        self.http = http
        self.url = base_url.rstrip("/") + EVENTS_PATH if base_url else None
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.buffer: deque[DataPlaneEvent] = deque()
        self.capacity = capacity
        self.dropped = 0
        self.sent = 0

    def emit(self, event: DataPlaneEvent) -> None:
        log.info("agent event", kind=event.kind, instance=event.instance_id, reason=event.reason, **event.detail)
        if len(self.buffer) >= self.capacity:
            self.buffer.popleft()
            self.dropped += 1
        self.buffer.append(event)

    async def flush(self) -> int:
        """Post what is buffered; returns how many the control plane accepted."""
        if self.url is None or self.http is None or not (self.buffer or self.dropped):
            if self.url is None:
                self.buffer.clear()
            return 0
        events = [self.buffer[i] for i in range(min(MAX_BATCH, len(self.buffer)))]
        batch = EventBatch(events=events, dropped=self.dropped)
        try:
            response = await self.http.post(self.url, content=batch.model_dump_json(), headers={
                **self.headers, "Content-Type": "application/json"})
        except httpx.TransportError as exc:
            log.info("events not shipped; kept for the next flush", error=type(exc).__name__, buffered=len(self.buffer))
            return 0
        if response.status_code >= 300:
            log.warning("control plane refused events", status=response.status_code, body=response.text[:300])
            if 400 <= response.status_code < 500 and response.status_code not in (401, 403, 404, 429):
                for _ in events:  # a batch the control plane will never take: drop it, count it
                    self.buffer.popleft()
                self.dropped += len(events)
            return 0
        for _ in events:
            self.buffer.popleft()
        self.dropped = 0
        self.sent += len(events)
        return len(events)
