"""One process's hold on one cutover while it runs its steps, verifies, or rolls back (`Runner`).

Split from `cutover.flows` (which keeps the entry points `execute`,
`rollback`, `abort` and the whole story in its docstring): every write a
runner makes is a compare-and-set on the revision it last wrote that also
renews its claim, so a runner that lost its claim finds its next write
refused and stops.

    run()            executing → each step (safety, before-state, apply, verify, event)
                     → verifying → every step re-read → completed
    _run_rollback()  each touched step, last first: restore, verify, event
                     → rolled_back | failed
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from common.errors import LifelineError
from common.logs import get_logger
from controlplane.db import session_scope
from cutover import repository, safety, service as cutover_service
from cutover.errors import CutoverInProgress
from contract.routing_tier import RoutingTier
from cutover.models import Cutover, CutoverStep
from cutover.policy import aware
from cutover.runtime import CutoverRuntime
from cutover.service import get_or_raise
from cutover.states import TERMINAL_STATES, TOUCHED_STEPS, CutoverEvent, CutoverState, StepStatus, transition
from cutover.drivers.step import StepCheck, StepState, StepTarget

log = get_logger(__name__)


def claim_live(cutover: Cutover, runtime: CutoverRuntime) -> bool:
    return cutover.claimed_until is not None and aware(cutover.claimed_until) > runtime.clock.utcnow()


class Runner:
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

    def _abort_requested(self, session: Any, *, lock: bool = False) -> dict[str, Any] | None:
        """An operator's abort of this cutover (`abort()`), if one is in the event log."""
        cutover = get_or_raise(session, cutover_id=self.cutover_id, lock=lock)
        request = abort_request(session, cutover)
        if request is None:
            return None
        return {"abort_event_id": request.id, "actor": request.actor, "reason": request.reason}

    def _stop_if_aborted(self) -> Cutover | None:
        """At a step boundary: roll back what was done if an operator asked to abort."""
        with session_scope(self.rt.reads) as session:
            request = self._abort_requested(session)
        if request is None:
            return None
        return self._fail_to_rollback(CutoverEvent.ROLLBACK, _aborted_by(request), request)

    def _steps(self) -> list[CutoverStep]:
        with session_scope(self.rt.factory) as session:
            return list(get_or_raise(session, cutover_id=self.cutover_id, fresh=True).steps)

    def _check(self, step: CutoverStep, expected: StepState, *, apply: bool) -> StepCheck:
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

    def _step_event(self, session: Any, cutover: Cutover, step: CutoverStep, *, kind: str, before: StepState | None,
                    expected: StepState, check: StepCheck, started_at: Any) -> None:
        cutover_service.record(
            session, cutover, kind=kind, actor=self.actor, reason=self.reason, clock=self.rt.clock,
            routing_tier=RoutingTier(step.tier), started_at=started_at,
            outcome="succeeded" if check.verified else "failed",
            before={"state": _as_json(before), "target": step.driver_target},
            after={"state": _as_json(check.observed), "expected": _as_json(expected), "target": step.driver_target,
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
                        clock=self.rt.clock, routing_tier=RoutingTier(step.tier), outcome="blocked",
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
                    before = driver.read_state(target_of(step))
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
            # Under the row lock `abort()` takes: an abort that answered 202 is seen here, never lost to completion.
            request = self._abort_requested(session, lock=True)
            if request is None:
                return self.cas(session, event=CutoverEvent.VERIFIED, evidence={"steps_verified": sorted(results)})
            self.cas(session, event=CutoverEvent.ROLLBACK, failure=_aborted_by(request), evidence=request)
        return self._run_rollback()

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


def _aborted_by(request: dict[str, Any]) -> str:
    return f"aborted by {request['actor']}: {request['reason']}"


def abort_request(session: Any, cutover: Cutover) -> Any | None:
    """The first abort request for `cutover` in the event log, or None."""
    from controlplane.event import service as event_service
    from controlplane.event.repository import EventFilter

    found = event_service.list_events(session, EventFilter(kind=ABORT_KIND, scope_prefix=cutover.scope), limit=1000)
    return next((e for e in found if (e.after or {}).get("cutover_id") == cutover.id), None)


def target_of(step: CutoverStep) -> StepTarget:
    return step.expected_before.target


def _as_json(state: StepState | None) -> dict[str, Any] | None:
    """A state as an event stores it: the JSON its step's row holds."""
    return None if state is None else state.model_dump(mode="json")
