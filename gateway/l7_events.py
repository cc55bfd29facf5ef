"""Every automatic L7 action a gateway takes becomes a control-plane event, shipped off the request path.

An instance suppressed after a failure, a stale generation fenced, an
instance ejected by the snapshot or a snapshot refused: each is a
`contract.events.DataPlaneEvent` with `routing_tier="l7"` and
`actor="gateway:<replica>"`, so a post-mortem can tell a gateway's own
removal from an operator's cutover (every routing change, at any tier, carries
its routing_tier).

`emit()` is synchronous and never waits: it appends to a bounded buffer
(`routing.event_buffer`) or, when the buffer is full, drops the event and
counts it (`lifeline_gateway_l7_events_dropped_total`, and `dropped` in the
next batch, so the control plane knows the log has a hole). The newest event
is the one dropped: the first events of an incident say what started it.
A background task POSTs `EventBatch`es of up to `contract.events.MAX_BATCH`
to `/api/v1/events/dataplane` every `routing.event_flush_interval`. A batch
the control plane could not take (transport error, 5xx, 429) goes back to
the front of the buffer and is retried; one it refuses as malformed (other
4xx) would be refused forever, so it is dropped, counted and logged.
Every event is also logged, so nothing is invisible without a control plane.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

import httpx
from prometheus_client import CollectorRegistry, Counter

from common.clock import Clock
from common.logs import get_logger
from contract.events import MAX_BATCH, DataPlaneEvent, EventBatch

log = get_logger(__name__)

EVENTS_PATH = "/api/v1/events/dataplane"
_RETRYABLE = {408, 429}


class EventSink(Protocol):
    def endpoint_ejected(self, instance_id: str, generation: int | None, reason: str, **detail: str | int | float | None) -> None:
        """The router's hook: this replica took an endpoint out of routing on its own (outlier ejection).

        A foreign generation answering is a fenced generation; any other failure a suppression.
        """
        kind = "generation.fenced" if reason == "stale_generation" else "instance.suppressed"
        self.emit(self.event(kind, reason, instance_id=instance_id, generation=generation, **detail))

    def emit(self, event: DataPlaneEvent) -> None: ...


class EventShipper:
    """A bounded buffer of L7 events and the task that ships it; `emit` is safe on any request path."""

    def __init__(self, *, replica_id: str, region: str, clock: Clock, buffer_size: int = 1000,
                 flush_interval: float = 0.5, controlplane_url: str | None = None, token: str | None = None,
                 http: httpx.AsyncClient | None = None, metrics_registry: CollectorRegistry | None = None,
                 timeout: httpx.Timeout | None = None) -> None:
        self.actor = f"gateway:{replica_id}"
        self.region = region
        self.clock = clock
        self.buffer: deque[DataPlaneEvent] = deque()
        self.buffer_size = buffer_size
        self.flush_interval = flush_interval
        self.shipping = controlplane_url is not None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = http or httpx.AsyncClient(
            base_url=controlplane_url or "http://controlplane.invalid", headers=headers,
            timeout=timeout or httpx.Timeout(connect=1.0, read=5.0, write=5.0, pool=1.0))
        self._owns_http = http is None
        self.dropped_total = 0
        self._dropped_unreported = 0
        self.shipped_total = 0
        self._dropped_metric = Counter("lifeline_gateway_l7_events_dropped", "L7 events dropped: buffer full or refused",
                                       registry=metrics_registry or CollectorRegistry())
        self._task: asyncio.Task | None = None

    # -- building and emitting -----------------------------------------------------------
    def event(self, kind: str, reason: str, *, instance_id: str | None = None, generation: int | None = None,
              **detail: str | int | float | bool | None) -> DataPlaneEvent:
        return DataPlaneEvent(kind=kind, routing_tier="l7", actor=self.actor, region=self.region,  # type: ignore[arg-type]
                              instance_id=instance_id, generation=generation, reason=reason[:2000],
                              at=self.clock.utcnow(), detail=detail)

    def endpoint_ejected(self, instance_id: str, generation: int | None, reason: str, **detail: str | int | float | None) -> None:
        """The router's hook: this replica took an endpoint out of routing on its own (outlier ejection).

        A foreign generation answering is a fenced generation; any other failure a suppression.
        """
        kind = "generation.fenced" if reason == "stale_generation" else "instance.suppressed"
        self.emit(self.event(kind, reason, instance_id=instance_id, generation=generation, **detail))

    def emit(self, event: DataPlaneEvent) -> None:
        log.info("l7 event", kind=event.kind, instance=event.instance_id, generation=event.generation,
                 reason=event.reason, **{f"detail_{k}": v for k, v in event.detail.items()})
        if not self.shipping:
            return
        if len(self.buffer) >= self.buffer_size:
            self._drop(1)
            return
        self.buffer.append(event)

    def _drop(self, count: int) -> None:
        self.dropped_total += count
        self._dropped_unreported += count
        self._dropped_metric.inc(count)

    # -- shipping ---------------------------------------------------------------------------
    async def flush_once(self) -> int:
        """Send up to one batch; the number of events the control plane took (0 if none or it failed)."""
        if not self.shipping or (not self.buffer and not self._dropped_unreported):
            return 0
        batch = [self.buffer.popleft() for _ in range(min(MAX_BATCH, len(self.buffer)))]
        dropped = self._dropped_unreported
        body = EventBatch(events=batch, dropped=dropped).model_dump(mode="json")
        try:
            response = await self.http.post(EVENTS_PATH, json=body)
        except httpx.HTTPError as exc:
            self.buffer.extendleft(reversed(batch))
            log.warning("l7 events not shipped; will retry", error=repr(exc)[:200], buffered=len(self.buffer))
            return 0
        if response.is_success:
            self._dropped_unreported -= dropped
            self.shipped_total += len(batch)
            return len(batch)
        if response.status_code >= 500 or response.status_code in _RETRYABLE:
            self.buffer.extendleft(reversed(batch))
            log.warning("l7 events not shipped; will retry", status=response.status_code, buffered=len(self.buffer))
            return 0
        self._drop(len(batch))
        log.error("l7 events refused by the control plane; dropped", status=response.status_code,
                  body=response.text[:300], events=len(batch))
        return 0

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval)
            try:
                while await self.flush_once() == MAX_BATCH:
                    pass
            except Exception as exc:  # never let the shipper die: the next tick tries again
                log.error("l7 event shipper failed", error=repr(exc)[:300])

    async def start(self) -> None:
        if self.shipping and self._task is None:
            self._task = asyncio.create_task(self._run(), name="l7-event-shipper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
            try:
                await asyncio.wait_for(self.flush_once(), timeout=1.0)  # best effort on a clean shutdown
            except (TimeoutError, httpx.HTTPError):
                pass
        if self._owns_http:
            await self.http.aclose()
