"""The cutover state machine: one table, one pure `transition()`.

                 start             steps_done           verified
    planned ──────────► executing ───────────► verifying ────────► completed
                           │  ▲                    │                   │
              step_failed  │  │ (resume after a    │ verify_failed     │ rollback
              rollback     │  │  crash: same state)│ rollback          │
                           ▼                       ▼                   ▼
                        rolling_back ◄─────────────┴───────────────────┘
                          │       │                     ▲
            rollback_done │       │ rollback_failed     │ rollback (retry)
                          ▼       ▼                     │
                   rolled_back   failed ────────────────┘

Persisted by compare-and-set on (state, revision): see
`cutover.repository.compare_and_set`. A crash leaves the cutover in
`executing`, `verifying` or `rolling_back` with its steps' recorded
before-states; `execute` or `rollback` picks it up from there once the dead
runner's claim has lapsed.
"""

from __future__ import annotations

from enum import StrEnum

from cutover.errors import InvalidTransition


class CutoverState(StrEnum):
    PLANNED = "planned"
    EXECUTING = "executing"
    VERIFYING = "verifying"
    COMPLETED = "completed"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"


class CutoverEvent(StrEnum):
    START = "start"
    STEPS_DONE = "steps_done"
    VERIFIED = "verified"
    VERIFY_FAILED = "verify_failed"
    STEP_FAILED = "step_failed"
    ROLLBACK = "rollback"
    ROLLBACK_DONE = "rollback_done"
    ROLLBACK_FAILED = "rollback_failed"


S, E = CutoverState, CutoverEvent

TRANSITIONS: dict[tuple[CutoverState, CutoverEvent], CutoverState] = {
    (S.PLANNED, E.START): S.EXECUTING,
    (S.EXECUTING, E.STEPS_DONE): S.VERIFYING,
    (S.EXECUTING, E.STEP_FAILED): S.ROLLING_BACK,
    (S.EXECUTING, E.ROLLBACK): S.ROLLING_BACK,
    (S.VERIFYING, E.VERIFIED): S.COMPLETED,
    (S.VERIFYING, E.VERIFY_FAILED): S.ROLLING_BACK,
    (S.VERIFYING, E.ROLLBACK): S.ROLLING_BACK,
    (S.COMPLETED, E.ROLLBACK): S.ROLLING_BACK,
    (S.ROLLING_BACK, E.ROLLBACK_DONE): S.ROLLED_BACK,
    (S.ROLLING_BACK, E.ROLLBACK_FAILED): S.FAILED,
    (S.FAILED, E.ROLLBACK): S.ROLLING_BACK,
}

# A runner holds the cutover while it is in one of these; at most one per scope.
ACTIVE_STATES = frozenset({S.EXECUTING, S.VERIFYING, S.ROLLING_BACK})
TERMINAL_STATES = frozenset({S.COMPLETED, S.ROLLED_BACK, S.FAILED})


def transition(state: CutoverState, event: CutoverEvent) -> CutoverState:
    """The state `event` leads to from `state`; `InvalidTransition` (409) if the table has no such edge."""
    try:
        return TRANSITIONS[(CutoverState(state), CutoverEvent(event))]
    except KeyError:
        raise InvalidTransition(f"a cutover in state {state} cannot {event}") from None


class StepStatus(StrEnum):
    """Where one step is. `actual_before` is recorded before `applying` is."""

    PENDING = "pending"  # nothing read, nothing changed
    APPLYING = "applying"  # before-state recorded; the change may or may not have reached the tier
    VERIFIED = "verified"  # the tier reads back the expected after-state
    FAILED = "failed"  # did not verify within its timeout (or the driver refused)
    REVERTING = "reverting"  # being put back to its recorded before-state
    REVERTED = "reverted"  # the tier reads back the recorded before-state
    REVERT_FAILED = "revert_failed"  # could not be put back; needs a person


# Steps whose before-state was recorded, so the tier may have changed: rollback restores these.
TOUCHED_STEPS = frozenset({StepStatus.APPLYING, StepStatus.VERIFIED, StepStatus.FAILED, StepStatus.REVERTING,
                           StepStatus.REVERT_FAILED})
