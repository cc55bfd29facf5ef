"""The states of one pool instance: one table, one pure `transition()`.

    COLD ──loaded──► WARM ──promoted──► SERVING ──drain──► DRAINING ──stopped──► GONE
      │               │  ◄──demoted───     │                                      ▲
      │               └──drain──► DRAINING │                                      │
      └───────────────┴────────lost (process died, probes failed)─────────────────┘

COLD: artifacts staged, the process starting and loading weights.
WARM: loaded, canary passed, no lease: gateways do not route to it.
SERVING: holds a lease (the agent renews it from probe results).
warm → serving is a routing change (an `l7` event), not a load; demoted
serving → warm (a rollback's spare) is one too. GONE is terminal: a
replacement is a new instance.
"""

from __future__ import annotations

from enum import StrEnum


class InstanceState(StrEnum):
    COLD = "cold"
    WARM = "warm"
    SERVING = "serving"
    DRAINING = "draining"
    GONE = "gone"


class PoolEvent(StrEnum):
    LOADED = "loaded"
    PROMOTED = "promoted"
    DEMOTED = "demoted"
    DRAIN = "drain"
    STOPPED = "stopped"
    LOST = "lost"


class InvalidTransition(Exception):
    """An event the state does not allow (HTTP 409 where it reaches an API)."""

    status_code = 409

    def __init__(self, state: InstanceState, event: PoolEvent) -> None:
        super().__init__(f"{event} is not allowed while {state}")
        self.state = state
        self.event = event


S, E = InstanceState, PoolEvent
TRANSITIONS: dict[tuple[InstanceState, PoolEvent], InstanceState] = {
    (S.COLD, E.LOADED): S.WARM,
    (S.WARM, E.PROMOTED): S.SERVING,
    (S.SERVING, E.DEMOTED): S.WARM,
    (S.SERVING, E.DRAIN): S.DRAINING,
    (S.WARM, E.DRAIN): S.DRAINING,
    (S.DRAINING, E.STOPPED): S.GONE,
    (S.COLD, E.LOST): S.GONE,
    (S.WARM, E.LOST): S.GONE,
    (S.SERVING, E.LOST): S.GONE,
    (S.DRAINING, E.LOST): S.GONE,
}

ROUTABLE = frozenset({S.SERVING})


def transition(state: InstanceState, event: PoolEvent) -> InstanceState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransition(state, event) from None
