"""The drill run state machine: one table, one pure `transition()`.

                 hold (zone/region)           approve
    scheduled ─────────────────────► awaiting_approval ──────► scheduled (approved_by set)
        │ start (instance, or approved)
        ▼
     running ──fault_cleared──► measuring ──pass──► passed
        │                          └───────fail──► failed
        └──error──► failed
    abort: from scheduled, awaiting_approval, running or measuring ──► aborted

A zone or region run is held for approval when it is created; `start` from
`scheduled` is allowed only where `may_start()` says so. Persisted by
compare-and-set on `(state, revision)` (`repository.compare_and_set`).
Terminal states are final: aborting a passed run is an invalid transition.
"""

from __future__ import annotations

from enum import StrEnum

from controlplane.drill.errors import InvalidTransition


class DrillScope(StrEnum):
    INSTANCE = "instance"
    ZONE = "zone"
    REGION = "region"


class DrillFault(StrEnum):
    SIGKILL = "sigkill"
    SIGSTOP = "sigstop"
    HANG = "hang"
    CORRUPT_WEIGHTS = "corrupt_weights"
    BAD_VERSION = "bad_version"
    ZONE_LOSS = "zone_loss"
    REGION_LOSS = "region_loss"
    CONTROLPLANE_DOWN = "controlplane_down"
    REDIS_DOWN = "redis_down"


class DrillRunState(StrEnum):
    SCHEDULED = "scheduled"
    AWAITING_APPROVAL = "awaiting_approval"
    RUNNING = "running"
    MEASURING = "measuring"
    PASSED = "passed"
    FAILED = "failed"
    ABORTED = "aborted"


class DrillRunEvent(StrEnum):
    HOLD = "hold"
    APPROVE = "approve"
    START = "start"
    FAULT_CLEARED = "fault_cleared"
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    ABORT = "abort"


S, E = DrillRunState, DrillRunEvent

TRANSITIONS: dict[tuple[DrillRunState, DrillRunEvent], DrillRunState] = {
    (S.SCHEDULED, E.HOLD): S.AWAITING_APPROVAL,
    (S.AWAITING_APPROVAL, E.APPROVE): S.SCHEDULED,
    (S.SCHEDULED, E.START): S.RUNNING,
    (S.RUNNING, E.FAULT_CLEARED): S.MEASURING,
    (S.RUNNING, E.ERROR): S.FAILED,
    (S.MEASURING, E.PASS): S.PASSED,
    (S.MEASURING, E.FAIL): S.FAILED,
    (S.SCHEDULED, E.ABORT): S.ABORTED,
    (S.AWAITING_APPROVAL, E.ABORT): S.ABORTED,
    (S.RUNNING, E.ABORT): S.ABORTED,
    (S.MEASURING, E.ABORT): S.ABORTED,
}

TERMINAL_STATES = frozenset({S.PASSED, S.FAILED, S.ABORTED})
ACTIVE_STATES = frozenset({S.RUNNING, S.MEASURING})

# Scopes an operator must approve, run by run, before the drill may start: their faults take out a zone or a region.
NEEDS_APPROVAL = frozenset({DrillScope.ZONE, DrillScope.REGION})


def transition(state: DrillRunState | str, event: DrillRunEvent | str) -> DrillRunState:
    """The state `event` leads to from `state`; `InvalidTransition` (409) if the table has no such edge."""
    try:
        return TRANSITIONS[(DrillRunState(state), DrillRunEvent(event))]
    except (KeyError, ValueError):
        raise InvalidTransition(f"a drill run in state {state} cannot {event}") from None


def may_start(scope: DrillScope | str, *, approved: bool) -> bool:
    """Instance drills start on their own; zone and region drills only once approved."""
    return DrillScope(scope) not in NEEDS_APPROVAL or approved
