"""Execute and roll back cutovers: the orchestration with side effects. Commits per step.

    execute(id, key)
      claim      planned → executing by compare-and-set (safety rules first;
                 break-glass overrides them and is evented); or take over an
                 executing/verifying/rolling_back cutover whose runner's claim lapsed
      each step  renew the claim, safety rules, read and record the before-state  [commit]
                 apply the expected after-state; verify within the step's timeout
                 step outcome + one `cutover.step` event                           [commit]
      all done   executing → verifying; re-verify every step; → completed          [commit]
      a step fails (or a rule refuses one): → rolling_back, then rollback below

    abort(id)
      an operator's request (an event) the runner reads at each step boundary:
      it stops and rolls back as below; with no live runner, rollback at once

    rollback(id)
      → rolling_back by compare-and-set; each touched step, last first: restore the
      recorded before-state, verify, one `cutover.rollback_step` event;
      → rolled_back, or → failed if any step could not be restored

Crash safety: every write to the tiers happens after the step's
before-state is committed, and every step write goes with a
compare-and-set of the cutover's revision that renews the runner's claim.
A runner that dies leaves `executing` / `verifying` / `rolling_back` with
`claimed_until` in the past; `execute` then resumes where it stopped
(re-applying an `applying` step is harmless: drivers are idempotent) and
`rollback` restores every step whose before-state was recorded. A runner
that lost its claim finds its next compare-and-set refused and stops.

Idempotency: `execute` with the key that started the cutover returns it
as it is while it is finished or still held by a live runner; it never
runs a second time.
"""

from __future__ import annotations

import uuid

from sqlalchemy.exc import IntegrityError

from common.logs import get_logger
from controlplane.db import session_scope
from cutover import repository, safety
from cutover import service as cutover_service
from cutover.errors import (
    BreakGlassNeedsReason,
    CutoverInProgress,
    InvalidTransition,
    SafetyRuleViolation,
    ScopeBusy,
)
from cutover.metrics import ABORT_REQUESTS
from cutover.models import Cutover
from cutover.policy import aware
from cutover.runner import ABORT_KIND, Runner, abort_request, claim_live
from cutover.runtime import CutoverRuntime
from cutover.service import get_or_raise
from cutover.states import ACTIVE_STATES, TERMINAL_STATES, CutoverEvent, CutoverState, transition

log = get_logger(__name__)


def execute(
    runtime: CutoverRuntime,
    *,
    cutover_id: int,
    idempotency_key: str,
    actor: str,
    break_glass_reason: str | None = None,
    break_glass: bool = False,
) -> Cutover:
    """Run a planned cutover to completed (or rolled back), or resume one a dead runner left.

    `break_glass` must be checked to be an admin's by the caller (the API and
    CLI do); it needs a reason and overrides every safety rule, evented.
    """
    if break_glass and not (break_glass_reason and break_glass_reason.strip()):
        raise BreakGlassNeedsReason("break-glass needs a reason; it is audited")
    runner_id = uuid.uuid4().hex
    clock = runtime.clock
    refused: list[safety.Violation] = []
    runner: Runner | None = None
    with session_scope(runtime.factory) as session:
        cutover = get_or_raise(session, cutover_id=cutover_id)
        state = CutoverState(cutover.state)
        repeated = cutover.idempotency_key == idempotency_key
        if repeated and (state in TERMINAL_STATES or (state in ACTIVE_STATES and claim_live(cutover, runtime))):
            return cutover  # the same request again: report, never run twice
        if state == CutoverState.PLANNED:
            violations = safety.evaluate(session, cutover=cutover, policy=runtime.policy, clock=clock,
                                         capacity=runtime.capacity)
            if violations and not break_glass:
                refused = violations
            else:
                busy = repository.active_for_scope(session, scope=cutover.scope)
                if busy is not None:
                    raise ScopeBusy(f"cutover #{busy.id} of {cutover.scope} is {busy.state}; one at a time per scope")
                runner = Runner(runtime, cutover, runner_id=runner_id, actor=actor, reason=cutover.reason,
                                 break_glass=break_glass)
                try:
                    with session.begin_nested():
                        runner.cas(session, event=CutoverEvent.START, idempotency_key=idempotency_key,
                                   executed_by=actor, started_at=clock.utcnow(), break_glass=break_glass,
                                   break_glass_reason=break_glass_reason if break_glass else None)
                except IntegrityError as exc:
                    raise ScopeBusy(f"another cutover of {cutover.scope} started first") from exc
                if break_glass:
                    cutover_service.record(
                        session, cutover, kind="cutover.break_glass", actor=actor, reason=break_glass_reason or "",
                        clock=clock, outcome="overridden",
                        after={"cutover_id": cutover.id, "overridden": [v.as_json() for v in violations]},
                    )
        elif state in ACTIVE_STATES:
            if claim_live(cutover, runtime):
                raise CutoverInProgress(
                    f"cutover #{cutover.id} is {state} under another runner until {cutover.claimed_until}",
                    retry_after_s=(aware(cutover.claimed_until) - clock.utcnow()).total_seconds(),  # type: ignore[arg-type]
                )
            runner = Runner(runtime, cutover, runner_id=runner_id, actor=actor, reason=cutover.reason,
                             break_glass=cutover.break_glass)
            runner.cas(session)
            cutover_service.record(
                session, cutover, kind="cutover.resumed", actor=actor, clock=clock,
                after={"cutover_id": cutover.id, "state": state.value, "previous_runner": cutover.runner},
            )
        else:
            transition(state, CutoverEvent.START)  # raises InvalidTransition (409)
    if refused:
        rules = [v.as_json() for v in refused]
        with session_scope(runtime.factory) as session:
            cutover = get_or_raise(session, cutover_id=cutover_id)
            cutover_service.record(session, cutover, kind="cutover.blocked", actor=actor, clock=clock,
                                   outcome="blocked", after={"cutover_id": cutover.id, "violations": rules})
        retry = [v.retry_after_s for v in refused if v.retry_after_s is not None]
        error = SafetyRuleViolation(
            "; ".join(v.message for v in refused) + " (break-glass: admin and a reason)", violations=rules
        )
        error.retry_after_s = max(retry) if retry and len(retry) == len(refused) else None
        raise error
    if runner is None:  # pragma: no cover - every branch above returns, raises or sets it
        raise RuntimeError("no runner")
    return runner.run()


def rollback(runtime: CutoverRuntime, *, cutover_id: int, actor: str, reason: str) -> Cutover:
    """Restore every touched step's recorded before-state, last first; itself evented.

    Never blocked by safety rules: it returns to recorded, known-good state.
    A cutover already rolled back is returned as it is.
    """
    clock = runtime.clock
    with session_scope(runtime.factory) as session:
        cutover = get_or_raise(session, cutover_id=cutover_id, lock=True)
        state = CutoverState(cutover.state)
        if state == CutoverState.ROLLED_BACK:
            return cutover
        if state in ACTIVE_STATES and claim_live(cutover, runtime):
            raise CutoverInProgress(
                f"cutover #{cutover.id} is {state} under a live runner until {cutover.claimed_until}; "
                "roll back once it has finished, or after its claim lapses",
            )
        runner = Runner(runtime, cutover, runner_id=uuid.uuid4().hex, actor=actor, reason=reason,
                         break_glass=cutover.break_glass)
        if state == CutoverState.ROLLING_BACK:
            runner.cas(session)  # take over a rollback a dead runner left
            cutover_service.record(session, cutover, kind="cutover.resumed", actor=actor, reason=reason, clock=clock,
                                   after={"cutover_id": cutover.id, "state": state.value,
                                          "previous_runner": cutover.runner})
        else:
            runner.cas(session, event=CutoverEvent.ROLLBACK, failure=None)
    return runner._run_rollback()


def abort(runtime: CutoverRuntime, *, cutover_id: int, actor: str, reason: str) -> Cutover:
    """Stop a running cutover and roll back what it did (Argo Rollouts' abort).

    The request is an event (`cutover.abort_requested`), which the runner
    reads at its next step boundary — after the step it is verifying now,
    at most that step's timeout — and then rolls back every touched step.
    A cutover whose runner is gone (its claim lapsed) is rolled back here
    at once. Planned or finished cutovers cannot be aborted (409: plan
    another, or roll back); one already rolling back is returned as it is.

    The cutover's row is locked while this decides, and the runner locks it
    to complete: two aborts write one request, and an abort either reaches
    the runner before it completes or finds the cutover completed (409).
    """
    with session_scope(runtime.factory) as session:
        cutover = get_or_raise(session, cutover_id=cutover_id, lock=True)
        state = CutoverState(cutover.state)
        if state == CutoverState.ROLLING_BACK:
            _aborted("already_rolling_back", cutover, actor)
            return cutover
        if state not in (CutoverState.EXECUTING, CutoverState.VERIFYING):
            raise InvalidTransition(f"cutover #{cutover.id} is {state}: only an executing or verifying cutover can "
                                    "be aborted (roll back a finished one)")
        if claim_live(cutover, runtime):
            if abort_request(session, cutover) is not None:
                _aborted("repeated", cutover, actor)
                return cutover
            cutover_service.record(session, cutover, kind=ABORT_KIND, actor=actor, reason=reason, clock=runtime.clock,
                                   outcome="requested", after={"cutover_id": cutover.id, "state": state.value})
            _aborted("requested", cutover, actor)
            return cutover
        runner = Runner(runtime, cutover, runner_id=uuid.uuid4().hex, actor=actor, reason=f"abort: {reason}",
                        break_glass=cutover.break_glass)
        # in this transaction, so a second abort waits for it and finds the cutover rolling back
        runner.cas(session, event=CutoverEvent.ROLLBACK, failure=f"aborted by {actor}: {reason}")
    _aborted("rolled_back_now", cutover, actor)
    return runner._run_rollback()


def _aborted(outcome: str, cutover: Cutover, actor: str) -> None:
    ABORT_REQUESTS.labels(outcome=outcome).inc()
    log.info("cutover_abort", cutover_id=cutover.id, outcome=outcome, actor=actor, state=cutover.state)
