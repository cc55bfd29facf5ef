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
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError

from common.errors import LifelineError
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
from cutover.models import Cutover, CutoverStep
from cutover.policy import aware
from cutover.service import CutoverRuntime, get_or_raise
from cutover.states import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    TOUCHED_STEPS,
    CutoverEvent,
    CutoverState,
    StepStatus,
    transition,
)
from cutover.tiers import StepCheck, event_tier

log = get_logger(__name__)


def _claim_live(cutover: Cutover, runtime: CutoverRuntime) -> bool:
    return cutover.claimed_until is not None and aware(cutover.claimed_until) > runtime.clock.utcnow()


class _Runner:
    """One process's hold on one cutover: every write is a compare-and-set on the revision it last wrote."""

    def __init__(self, runtime: CutoverRuntime, cutover: Cutover, *, runner_id: str, actor: str, reason: str,
                 break_glass: bool) -> None:
        self.rt = runtime
        self.cutover_id = cutover.id
        self.state = CutoverState(cutover.state)
        self.revision = cutover.revision
        self.runner_id = runner_id
        self.actor = actor
        self.reason = reason
        self.break_glass = break_glass

    # -- persistence
    def _claim_until(self, step_timeout_s: float = 0.0) -> Any:
        return self.rt.clock.utcnow() + self.rt.policy.claim_ttl + timedelta(seconds=step_timeout_s)

    def cas(self, session: Any, *, event: CutoverEvent | None = None, step_timeout_s: float = 0.0,
            evidence: dict[str, Any] | None = None, **values: Any) -> Cutover:
        """Renew the claim (and move the state when `event` is given); refused if anyone else wrote since."""
        new_state = transition(self.state, event) if event else self.state
        now = self.rt.clock.utcnow()
        finished = new_state in TERMINAL_STATES
        ok = repository.compare_and_set(
            session, cutover_id=self.cutover_id, expected_state=self.state.value, expected_revision=self.revision,
            state=new_state.value, updated_at=now,
            runner=None if finished else self.runner_id,
            claimed_until=None if finished else self._claim_until(step_timeout_s),
            **({"ended_at": now} if finished else {}),
            **values,
        )
        if not ok:
            raise CutoverInProgress(f"cutover #{self.cutover_id} changed under this runner; it stops here")
        self.revision += 1
        cutover = get_or_raise(session, cutover_id=self.cutover_id, fresh=True)
        if event is not None:
            cutover_service.record(
                session, cutover, kind="cutover.transition", actor=self.actor, reason=self.reason,
                clock=self.rt.clock, before={"state": self.state.value},
                after={"state": new_state.value, "event": event.value, **({"evidence": evidence} if evidence else {})},
            )
        self.state = new_state
        return cutover

    def _abort_requested(self) -> dict[str, Any] | None:
        """An operator's abort of this cutover (`abort()`), if one is in the event log."""
        with session_scope(self.rt.reads) as session:
            cutover = get_or_raise(session, cutover_id=self.cutover_id)
            request = abort_request(session, cutover)
            if request is None:
                return None
            return {"abort_event_id": request.id, "actor": request.actor, "reason": request.reason}

    def _stop_if_aborted(self) -> Cutover | None:
        """At a step boundary: roll back what was done if an operator asked to abort."""
        request = self._abort_requested()
        if request is None:
            return None
        return self._fail_to_rollback(CutoverEvent.ROLLBACK,
                                      f"aborted by {request['actor']}: {request['reason']}", request)

    def _steps(self) -> list[CutoverStep]:
        with session_scope(self.rt.factory) as session:
            return list(get_or_raise(session, cutover_id=self.cutover_id, fresh=True).steps)

    def _check(self, step: CutoverStep, expected: dict[str, Any], *, apply: bool) -> StepCheck:
        driver = self.rt.driver_named(step.tier, step.driver)
        if driver is None:
            return StepCheck(False, None, {"error": "tier_not_configured",
                                           "message": f"no {step.tier} driver named {step.driver!r} is configured"})
        try:
            if apply:
                driver.apply(expected)
            return driver.verify(expected, timedelta(seconds=step.timeout_s))
        except LifelineError as exc:
            return StepCheck(False, None, {"error": exc.error_type, "message": exc.message})
        except Exception as exc:  # a driver bug must fail the step, not strand the cutover in executing
            log.error("cutover_driver_crashed", cutover_id=self.cutover_id, step=step.position, error=repr(exc))
            return StepCheck(False, None, {"error": "driver_error", "message": repr(exc)[:500]})

    def _step_event(self, session: Any, cutover: Cutover, step: CutoverStep, *, kind: str, before: Any,
                    expected: Any, check: StepCheck, started_at: Any) -> None:
        cutover_service.record(
            session, cutover, kind=kind, actor=self.actor, reason=self.reason, clock=self.rt.clock,
            routing_tier=event_tier(step.tier), started_at=started_at,
            outcome="succeeded" if check.verified else "failed",
            before={"state": before, "target": step.driver_target},
            after={"state": check.observed, "expected": expected, "target": step.driver_target,
                   "cutover_id": cutover.id, "step": step.position, "driver": step.driver,
                   "evidence": check.evidence},
        )

    # -- executing
    def run(self) -> Cutover:
        if self.state == CutoverState.EXECUTING:
            return self._run_steps()
        if self.state == CutoverState.VERIFYING:
            return self._final_verify()
        if self.state == CutoverState.ROLLING_BACK:
            return self._run_rollback()
        with session_scope(self.rt.factory) as session:
            return get_or_raise(session, cutover_id=self.cutover_id)

    def _fail_to_rollback(self, event: CutoverEvent, failure: str, evidence: dict[str, Any] | None = None) -> Cutover:
        with session_scope(self.rt.factory) as session:
            self.cas(session, event=event, failure=failure, evidence=evidence)
        return self._run_rollback()

    def _run_steps(self) -> Cutover:
        for step in self._steps():
            if step.status == StepStatus.VERIFIED:
                continue
            if (aborted := self._stop_if_aborted()) is not None:
                return aborted
            driver = self.rt.driver_named(step.tier, step.driver)
            started_at = step.started_at or self.rt.clock.utcnow()
            with session_scope(self.rt.factory) as session:
                cutover = self.cas(session, step_timeout_s=step.timeout_s)
                violations = [] if self.break_glass else safety.evaluate(
                    session, cutover=cutover, policy=self.rt.policy, clock=self.rt.clock,
                    capacity=self.rt.capacity, include_wait=False,
                )
            if violations:
                rules = [v.as_json() for v in violations]
                with session_scope(self.rt.factory) as session:
                    cutover = get_or_raise(session, cutover_id=self.cutover_id)
                    cutover_service.record(
                        session, cutover, kind="cutover.blocked", actor=self.actor, reason=self.reason,
                        clock=self.rt.clock, routing_tier=event_tier(step.tier), outcome="blocked",
                        after={"cutover_id": cutover.id, "step": step.position, "violations": rules},
                    )
                return self._fail_to_rollback(
                    CutoverEvent.STEP_FAILED, f"step {step.position}: refused by {rules[0]['rule']}",
                    {"violations": rules},
                )
            if step.status == StepStatus.PENDING:
                try:
                    if driver is None:
                        raise LifelineError(f"no {step.tier} driver named {step.driver!r}", type="tier_not_configured")
                    before = driver.read_state(_target_of(step))
                except LifelineError as exc:
                    return self._fail_to_rollback(
                        CutoverEvent.STEP_FAILED, f"step {step.position}: could not read its state: {exc.message}",
                        {"error": exc.error_type},
                    )
                with session_scope(self.rt.factory) as session:
                    self.cas(session, step_timeout_s=step.timeout_s)
                    repository.update_step(session, step_id=step.id, actual_before=before,
                                           status=StepStatus.APPLYING.value, started_at=started_at)
                step.actual_before = before
            check = self._check(step, step.expected_after, apply=True)
            with session_scope(self.rt.factory) as session:
                cutover = self.cas(session)
                status = StepStatus.VERIFIED if check.verified else StepStatus.FAILED
                repository.update_step(session, step_id=step.id, status=status.value,
                                       outcome="succeeded" if check.verified else "failed",
                                       evidence=check.evidence, ended_at=self.rt.clock.utcnow())
                self._step_event(session, cutover, step, kind="cutover.step", before=step.actual_before,
                                 expected=step.expected_after, check=check, started_at=started_at)
            if not check.verified:
                return self._fail_to_rollback(
                    CutoverEvent.STEP_FAILED,
                    f"step {step.position} ({step.tier} {step.driver_target}) did not verify within "
                    f"{step.timeout_s:g}s",
                    check.evidence,
                )
        if (aborted := self._stop_if_aborted()) is not None:
            return aborted
        with session_scope(self.rt.factory) as session:
            self.cas(session, event=CutoverEvent.STEPS_DONE)
        return self._final_verify()

    def _final_verify(self) -> Cutover:
        """Every step still shows its after-state (a later step or someone else may have undone one)."""
        if (aborted := self._stop_if_aborted()) is not None:
            return aborted
        results = {}
        for step in self._steps():
            check = self._check(step, step.expected_after, apply=False)
            results[step.position] = check
            if not check.verified:
                return self._fail_to_rollback(
                    CutoverEvent.VERIFY_FAILED,
                    f"step {step.position} no longer shows its after-state",
                    {"step": step.position, "evidence": check.evidence},
                )
        with session_scope(self.rt.factory) as session:
            return self.cas(session, event=CutoverEvent.VERIFIED,
                            evidence={"steps_verified": sorted(results)})

    # -- rolling back
    def _run_rollback(self) -> Cutover:
        restored_all = True
        for step in reversed(self._steps()):
            if step.status not in TOUCHED_STEPS or step.actual_before is None:
                continue
            started_at = step.revert_started_at or self.rt.clock.utcnow()
            with session_scope(self.rt.factory) as session:
                self.cas(session, step_timeout_s=step.timeout_s)
                repository.update_step(session, step_id=step.id, status=StepStatus.REVERTING.value,
                                       revert_started_at=started_at)
            check = self._check(step, step.actual_before, apply=True)
            with session_scope(self.rt.factory) as session:
                cutover = self.cas(session)
                status = StepStatus.REVERTED if check.verified else StepStatus.REVERT_FAILED
                repository.update_step(session, step_id=step.id, status=status.value, revert_evidence=check.evidence,
                                       revert_ended_at=self.rt.clock.utcnow())
                self._step_event(session, cutover, step, kind="cutover.rollback_step", before=step.expected_after,
                                 expected=step.actual_before, check=check, started_at=started_at)
            restored_all = restored_all and check.verified
        with session_scope(self.rt.factory) as session:
            if restored_all:
                return self.cas(session, event=CutoverEvent.ROLLBACK_DONE)
            return self.cas(session, event=CutoverEvent.ROLLBACK_FAILED,
                            failure="a step could not be restored to its recorded before-state; see its revert evidence")


ABORT_KIND = "cutover.abort_requested"


def abort_request(session: Any, cutover: Cutover) -> Any | None:
    """The first abort request for `cutover` in the event log, or None."""
    from controlplane.event import service as event_service
    from controlplane.event.repository import EventFilter

    found = event_service.list_events(session, EventFilter(kind=ABORT_KIND, scope_prefix=cutover.scope), limit=1000)
    return next((e for e in found if (e.after or {}).get("cutover_id") == cutover.id), None)


def _target_of(step: CutoverStep) -> dict[str, Any]:
    return dict(step.expected_before.get("target") or {})


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
    runner: _Runner | None = None
    with session_scope(runtime.factory) as session:
        cutover = get_or_raise(session, cutover_id=cutover_id)
        state = CutoverState(cutover.state)
        repeated = cutover.idempotency_key == idempotency_key
        if repeated and (state in TERMINAL_STATES or (state in ACTIVE_STATES and _claim_live(cutover, runtime))):
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
                runner = _Runner(runtime, cutover, runner_id=runner_id, actor=actor, reason=cutover.reason,
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
            if _claim_live(cutover, runtime):
                raise CutoverInProgress(
                    f"cutover #{cutover.id} is {state} under another runner until {cutover.claimed_until}",
                    retry_after_s=(aware(cutover.claimed_until) - clock.utcnow()).total_seconds(),  # type: ignore[arg-type]
                )
            runner = _Runner(runtime, cutover, runner_id=runner_id, actor=actor, reason=cutover.reason,
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
        cutover = get_or_raise(session, cutover_id=cutover_id)
        state = CutoverState(cutover.state)
        if state == CutoverState.ROLLED_BACK:
            return cutover
        if state in ACTIVE_STATES and _claim_live(cutover, runtime):
            raise CutoverInProgress(
                f"cutover #{cutover.id} is {state} under a live runner until {cutover.claimed_until}; "
                "roll back once it has finished, or after its claim lapses",
            )
        runner = _Runner(runtime, cutover, runner_id=uuid.uuid4().hex, actor=actor, reason=reason,
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
    """
    with session_scope(runtime.factory) as session:
        cutover = get_or_raise(session, cutover_id=cutover_id)
        state = CutoverState(cutover.state)
        if state == CutoverState.ROLLING_BACK:
            return cutover
        if state not in (CutoverState.EXECUTING, CutoverState.VERIFYING):
            raise InvalidTransition(f"cutover #{cutover.id} is {state}: only an executing or verifying cutover can "
                                    "be aborted (roll back a finished one)")
        live = _claim_live(cutover, runtime)
        if live and abort_request(session, cutover) is None:
            cutover_service.record(session, cutover, kind=ABORT_KIND, actor=actor, reason=reason, clock=runtime.clock,
                                   outcome="requested", after={"cutover_id": cutover.id, "state": state.value})
        if live:
            return cutover
    return rollback(runtime, cutover_id=cutover_id, actor=actor, reason=f"abort: {reason}")
