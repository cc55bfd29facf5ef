"""Whether this engine takes new requests: one state, changed only by `transition()`.

    STARTING ──self_test_passed──► READY ◄──lease_registered── PARTITIONED
                                     │  ──────lease_lapsed─────►    │
                                     │                              │
                 ┌───────────────────┴──drain_started───────────────┘ (and from STARTING)
                 ▼
              DRAINING                READY|PARTITIONED ──superseded──► SUPERSEDED

Only READY takes new requests. PARTITIONED is an engine whose lease could not
be renewed for a TTL: gateways have stopped routing to it, so whatever still
arrives was routed on stale facts and is refused with a 503 the gateway
migrates on; it is READY again, under a new generation, once it registers.
DRAINING (a planned shutdown) and SUPERSEDED (a newer process holds this
instance id) are terminal.
"""

from __future__ import annotations

from enum import StrEnum


class EngineStatus(StrEnum):
    STARTING = "starting"
    READY = "ready"
    PARTITIONED = "partitioned"
    DRAINING = "draining"
    SUPERSEDED = "superseded"


class LifecycleEvent(StrEnum):
    SELF_TEST_PASSED = "self_test_passed"
    LEASE_REGISTERED = "lease_registered"
    LEASE_LAPSED = "lease_lapsed"
    SUPERSEDED = "superseded"
    DRAIN_STARTED = "drain_started"


class InvalidTransition(Exception):
    def __init__(self, status: EngineStatus, event: LifecycleEvent) -> None:
        super().__init__(f"{event} is not allowed while {status}")
        self.status = status
        self.event = event


S, E = EngineStatus, LifecycleEvent
TRANSITIONS: dict[tuple[EngineStatus, LifecycleEvent], EngineStatus] = {
    (S.STARTING, E.SELF_TEST_PASSED): S.READY,
    (S.READY, E.LEASE_REGISTERED): S.READY,
    (S.READY, E.LEASE_LAPSED): S.PARTITIONED,
    (S.PARTITIONED, E.LEASE_LAPSED): S.PARTITIONED,
    (S.PARTITIONED, E.LEASE_REGISTERED): S.READY,
    (S.READY, E.SUPERSEDED): S.SUPERSEDED,
    (S.PARTITIONED, E.SUPERSEDED): S.SUPERSEDED,
    (S.STARTING, E.DRAIN_STARTED): S.DRAINING,
    (S.READY, E.DRAIN_STARTED): S.DRAINING,
    (S.PARTITIONED, E.DRAIN_STARTED): S.DRAINING,
    (S.SUPERSEDED, E.DRAIN_STARTED): S.DRAINING,
}


def transition(status: EngineStatus, event: LifecycleEvent) -> EngineStatus:
    try:
        return TRANSITIONS[(status, event)]
    except KeyError:
        raise InvalidTransition(status, event) from None
