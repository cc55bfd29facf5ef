"""The states of a dead letter and the one table of what an operator or a worker may do to it.

    dead     ──retry──►  retrying  ──copied──►  row deleted  (verified, or found already there)
    dead     ◄──failed─  retrying                 (its last attempt failed again)
    dead     ──clear──►  cleared   ◄──clear──  retrying
    cleared  ──retry──►  retrying                 (the source was fixed after all)

    cleared: not reported, and sweeps still skip it, so it is not dead-lettered again and again.

`retry` of a retrying letter and `clear` of a cleared one are no-ops, so an
operator (or a client that timed out) can send either twice. `copied` and
`failed` are the worker's; they apply to a retrying letter only.
"""

from __future__ import annotations

from enum import StrEnum

from controlplane.replication.errors import InvalidDeadLetterTransition


class DeadLetterState(StrEnum):
    DEAD = "dead"  # given up after the policy's attempts; sweeps skip it; reported
    RETRYING = "retrying"  # an operator asked for it again; the next sweep plans it; reported
    CLEARED = "cleared"  # an operator accepted the loss; sweeps skip it; not reported


class DeadLetterAction(StrEnum):
    RETRY = "retry"
    CLEAR = "clear"
    FAILED = "failed"  # the worker's last attempt at a retrying letter failed


# Every state the action may start from, and where it goes. Absent: refused (409).
TRANSITIONS: dict[tuple[DeadLetterState, DeadLetterAction], DeadLetterState] = {
    (DeadLetterState.DEAD, DeadLetterAction.RETRY): DeadLetterState.RETRYING,
    (DeadLetterState.CLEARED, DeadLetterAction.RETRY): DeadLetterState.RETRYING,
    (DeadLetterState.RETRYING, DeadLetterAction.RETRY): DeadLetterState.RETRYING,
    (DeadLetterState.DEAD, DeadLetterAction.CLEAR): DeadLetterState.CLEARED,
    (DeadLetterState.RETRYING, DeadLetterAction.CLEAR): DeadLetterState.CLEARED,
    (DeadLetterState.CLEARED, DeadLetterAction.CLEAR): DeadLetterState.CLEARED,
    (DeadLetterState.RETRYING, DeadLetterAction.FAILED): DeadLetterState.DEAD,
}

# States whose checkpoint a sweep does not plan and a copy task refuses.
SKIPPED = frozenset({DeadLetterState.DEAD, DeadLetterState.CLEARED})
# States the status and the metrics report.
REPORTED = frozenset({DeadLetterState.DEAD, DeadLetterState.RETRYING})


def transition(state: DeadLetterState | str, action: DeadLetterAction) -> DeadLetterState:
    """Pure: the state after `action`, or InvalidDeadLetterTransition (409)."""
    try:
        return TRANSITIONS[(DeadLetterState(state), action)]
    except KeyError:
        raise InvalidDeadLetterTransition(f"a {state} dead letter cannot be {action}") from None
