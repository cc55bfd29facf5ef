"""Automatic routing actions of the data plane, into the same append-only event log.

A gateway (or regional agent) ships `contract.events.EventBatch`es in the
background; each event becomes one row with its `routing_tier`, the
sender's actor (`gateway:<replica>`), reason, `at` as its start, and scope
`region:<r>/instance:<id>` — so `GET /api/v1/events?routing_tier=l7` shows
a gateway's automatic suppressions beside operators' cutovers, and the
actor tells them apart. The authenticated token is kept in `after` as
`reported_by`. A batch's `dropped` count (events the sender lost to a full
buffer) is itself recorded, as one `dataplane.events_dropped` event, so a
gap in the log is visible rather than silent.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from common.clock import Clock
from contract.events import DataPlaneEvent, EventBatch
from controlplane.errors import InvalidInput
from controlplane.types import first_nul
from controlplane.event import service
from contract.routing_tier import RoutingTier

ACTOR_PREFIXES = ("gateway:", "agent:")


def _scope(event: DataPlaneEvent) -> str:
    scope = f"region:{event.region}"
    return f"{scope}/instance:{event.instance_id}" if event.instance_id else scope


def is_wrong_output_verdict(event: dict[str, Any], instance_id: str) -> bool:
    """An event log row (as the API reads it back) of an agent's `probe.verdict` saying the instance answered its
    canary with other tokens than recorded: `_scope`'s instance scope, the detail kept in `after`."""
    return (event.get("kind", "").endswith("probe.verdict") and str(event.get("scope", "")).endswith(
        f"/instance:{instance_id}") and (event.get("after") or {}).get("verdict") == "wrong_output")


def _check_actor(actor: str, *, allowed: tuple[str, ...]) -> None:
    if not actor.startswith(allowed) or len(actor) == len(actor.split(":", 1)[0]) + 1:
        raise InvalidInput(f"actor {actor!r} must be {' or '.join(p + '<name>' for p in allowed)}", param="actor")


def record_batch(session: Session, *, batch: EventBatch, reported_by: str, clock: Clock,
                 actor_prefixes: tuple[str, ...] = ACTOR_PREFIXES) -> int:
    """Write every event of the batch (and its drop count); the number of rows written.

    `actor_prefixes` are the actors the sender's token may speak for: a gateway token only
    `gateway:`, an agent token only `agent:` (an admin replaying by hand, either).
    """
    nul = first_nul(batch.model_dump(mode="json"))
    if nul:
        raise InvalidInput(f"{nul} contains a NUL byte", param=nul)
    for event in batch.events:
        _check_actor(event.actor, allowed=actor_prefixes)
    for event in batch.events:
        service.record(
            session, kind=event.kind, routing_tier=RoutingTier(event.routing_tier), actor=event.actor, reason=event.reason,
            scope=_scope(event), started_at=event.at, clock=clock,
            after={"generation": event.generation, **event.detail, "reported_by": reported_by},
        )
    written = len(batch.events)
    if batch.dropped:
        actor = batch.events[0].actor if batch.events else reported_by
        region = batch.events[0].region if batch.events else None
        service.record(
            session, kind="dataplane.events_dropped", routing_tier=RoutingTier.L7, actor=actor,
            reason=f"{batch.dropped} event(s) dropped by the sender since its last batch (buffer full)",
            scope=f"region:{region}" if region else "dataplane", outcome="failed", clock=clock,
            after={"dropped": batch.dropped, "reported_by": reported_by},
        )
        written += 1
    return written
