"""Replication policy logic and the bookkeeping workers do. Never commits; the caller's unit of work does.

A policy is set whole (`put_policy`), by compare-and-set on its revision
(`expected_revision`, 0: must be new), and every change writes one
`replication.policy` event with the policy before and after (store URLs
redacted). Workers record a sweep, a verified copy, deletions and dead letters
here; a dead letter is also an event (`replication.dead_letter`, outcome
`failed`), so an operator finds it in the event log as well as in the status.

An operator retries or clears dead letters (`change_dead_letters`, the table
in `states.py`): one `replication.dead_letter.retry|clear` event per request
that changed something; a retry also makes the policy due at the next sweep.
A retried letter that a worker then copies is deleted, with one
`replication.dead_letter.replicated` event.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from common.clock import Clock
from controlplane.event import service as event_service
from controlplane.replication import repository
from controlplane.replication.errors import (
    ReplicationDeadLetterConflict,
    ReplicationDeadLetterNotFound,
    ReplicationPolicyConflict,
    ReplicationPolicyNotFound,
)
from controlplane.replication.models import ReplicationDeadLetter, ReplicationPolicy, ReplicationStatus
from controlplane.replication.schemas import (
    DeadLetterActionRead,
    DeadLetterRead,
    DeadLetterSelection,
    PolicyDeadLetters,
    ReplicationClassStatus,
    ReplicationMode,
    ReplicationPolicyRead,
    ReplicationPolicySpec,
    ReplicationStatusRead,
)
from controlplane.replication.states import REPORTED, SKIPPED, DeadLetterAction, DeadLetterState, transition
from controlplane.routing_version import service as routing_version


def _scope(model: str, session_class: str) -> str:
    return f"model:{model}/session_class:{session_class}"


def _read(policy: ReplicationPolicy) -> dict[str, object]:
    return ReplicationPolicyRead.model_validate(policy).model_dump(mode="json")


def put_policy(session: Session, *, spec: ReplicationPolicySpec, actor: str, clock: Clock) -> ReplicationPolicy:
    """Create or replace the policy of (model, session class); one `replication.policy` event.

    Gateways read policies from the routing snapshot, so a change advances the routing version in the same
    transaction: a gateway polling with the old ETag would otherwise get 304 and keep the old policy."""
    now = clock.utcnow()
    current = repository.get_policy(session, model=spec.model, session_class=spec.session_class)
    held = current.revision if current is not None else 0
    if spec.expected_revision is not None and spec.expected_revision != held:
        raise ReplicationPolicyConflict(f"replication policy {spec.model}/{spec.session_class} is at revision "
                                        f"{held}, not {spec.expected_revision}")
    values = spec.model_dump(exclude={"model", "session_class", "expected_revision"})
    values["mode"] = spec.mode.value
    before = _read(current) if current is not None else None
    if current is None:
        policy = ReplicationPolicy(model=spec.model, session_class=spec.session_class, revision=1, updated_by=actor,
                                   created_at=now, updated_at=now, **values)
        try:
            with session.begin_nested():
                session.add(policy)
                session.flush()
                session.add(ReplicationStatus(policy_id=policy.id, pending=0, replicated_total=0,
                                              blocks_copied_total=0, deleted_total=0))
                session.flush()
        except IntegrityError as exc:
            raise ReplicationPolicyConflict(f"replication policy {spec.model}/{spec.session_class} was created "
                                            "concurrently; read it again") from exc
    else:
        if not repository.compare_and_set_policy(session, policy_id=current.id, expected_revision=current.revision,
                                                 updated_by=actor, updated_at=now, **values):
            raise ReplicationPolicyConflict(f"replication policy {spec.model}/{spec.session_class} changed "
                                            "concurrently; read it again")
        session.expire(current)
        policy = current
    after = _read(policy)
    routing_version.bump(session, clock=clock)
    event_service.record(session, kind="replication.policy", actor=actor, reason=spec.reason,
                         scope=_scope(spec.model, spec.session_class), clock=clock, before=before, after=after)
    return policy


def get_policy_or_raise(session: Session, *, model: str, session_class: str) -> ReplicationPolicy:
    policy = repository.get_policy(session, model=model, session_class=session_class)
    if policy is None:
        raise ReplicationPolicyNotFound(f"no replication policy for model {model!r}, session class "
                                        f"{session_class!r}")
    return policy


def list_policies(session: Session, *, model: str | None = None) -> Sequence[ReplicationPolicy]:
    return repository.list_policies(session, model=model)


# -- what the beat and the workers record ---------------------------------------------------------------


def is_due(*, mode: str, every_seconds: int | None, last_sweep_at: datetime | None, now: datetime,
           pending: int = 0, replan_after: timedelta | None = None) -> bool:
    """Pure: a rebuildable policy never; a critical one at every beat; an interactive one every T seconds.

    Not while the last sweep's copies are still pending (each verified copy or dead letter counts one
    down), unless that sweep is older than `replan_after`: a sweep that came round during a long copy
    would queue the same checkpoints again. The bound re-plans a backlog whose count went wrong (a
    copy lost with its message), since the stores, not the count, are the truth.
    """
    if mode == ReplicationMode.REBUILDABLE:
        return False
    if last_sweep_at is None:
        return True
    if pending > 0 and replan_after is not None and now - last_sweep_at < replan_after:
        return False
    if mode == ReplicationMode.CRITICAL or every_seconds is None:
        return True
    return now - last_sweep_at >= timedelta(seconds=every_seconds)


def due_policies(session: Session, *, clock: Clock, replan_after: timedelta | None = None) -> list[ReplicationPolicy]:
    now = clock.utcnow()
    due = []
    for policy in repository.list_policies(session):
        status = repository.get_status(session, policy_id=policy.id)
        if is_due(mode=policy.mode, every_seconds=policy.every_seconds,
                  last_sweep_at=status.last_sweep_at if status else None, now=now,
                  pending=status.pending if status else 0, replan_after=replan_after):
            due.append(policy)
    return due


def dead_lettered_keys(session: Session, *, policy_id: int) -> set[str]:
    """The checkpoints a sweep must not plan: dead or cleared letters (a retrying one is planned)."""
    return {d.checkpoint_key for d in repository.dead_letters(session, policy_id=policy_id, states=SKIPPED)}


def is_dead_lettered(session: Session, *, policy_id: int, key: str) -> bool:
    """A copy task refuses a dead or cleared letter's checkpoint (one sent before the letter was written)."""
    letter = repository.get_dead_letter(session, policy_id=policy_id, key=key)
    return letter is not None and letter.state in SKIPPED


def record_letter_copied(session: Session, *, policy_id: int, key: str, clock: Clock) -> bool:
    """A retried letter's checkpoint is at the destination now: delete the letter; True if there was one."""
    if not repository.delete_dead_letter(session, policy_id=policy_id, key=key,
                                         expected_state=DeadLetterState.RETRYING):
        return False
    policy = repository.get_policy_by_id(session, policy_id=policy_id)
    if policy is not None:
        event_service.record(session, kind="replication.dead_letter.replicated", actor="replication",
                             reason="a retried dead letter was copied and verified",
                             scope=_scope(policy.model, policy.session_class), clock=clock,
                             before={"checkpoint": key, "state": DeadLetterState.RETRYING.value}, after=None)
    return True


def list_dead_letters(session: Session, *, model: str | None = None, session_class: str | None = None,
                      include_cleared: bool = False) -> list[PolicyDeadLetters]:
    """Per policy (those with any), its dead letters: dead and retrying, and cleared ones if asked."""
    states = None if include_cleared else REPORTED
    rows = []
    for policy in repository.list_policies(session, model=model):
        if session_class is not None and policy.session_class != session_class:
            continue
        letters = repository.dead_letters(session, policy_id=policy.id, states=states)
        if letters:
            rows.append(PolicyDeadLetters(model=policy.model, session_class=policy.session_class,
                                          dead_letters=[DeadLetterRead.model_validate(d) for d in letters]))
    return rows


def change_dead_letters(session: Session, *, selection: DeadLetterSelection, action: DeadLetterAction,
                        actor: str, clock: Clock) -> DeadLetterActionRead:
    """Retry or clear dead letters of one policy, all or nothing; one event if anything changed.

    Named keys that are not dead letters of the policy refuse the request (404) before anything is
    written; letters already in the target state are reported `unchanged` (the call is idempotent).
    Each change is a compare-and-set on the letter's state, so a worker that moved a letter meanwhile
    makes the request 409 and the unit of work rolls back.
    """
    policy = get_policy_or_raise(session, model=selection.model, session_class=selection.session_class)
    if selection.checkpoint_keys is None:
        letters = list(repository.dead_letters(session, policy_id=policy.id, states={DeadLetterState.DEAD}))
    else:
        held = {d.checkpoint_key: d for d in repository.dead_letters(session, policy_id=policy.id)}
        wanted = list(dict.fromkeys(selection.checkpoint_keys))
        missing = [key for key in wanted if key not in held]
        if missing:
            raise ReplicationDeadLetterNotFound(
                f"{len(missing)} of the named checkpoints are not dead letters of {policy.model}/"
                f"{policy.session_class}, e.g. {missing[0]!r}; nothing was changed")
        letters = [held[key] for key in wanted]
    now = clock.utcnow()
    target = transition(DeadLetterState.DEAD, action)
    changed, unchanged, before = [], [], []
    for letter in letters:
        state = transition(letter.state, action)
        if state == letter.state:
            unchanged.append(letter.checkpoint_key)
            continue
        if not repository.compare_and_set_dead_letter(session, letter_id=letter.id, expected_state=letter.state,
                                                      state=state.value, state_changed_at=now,
                                                      state_changed_by=actor):
            raise ReplicationDeadLetterConflict(f"dead letter {letter.checkpoint_key!r} changed state "
                                                "concurrently; read it again")
        before.append({"checkpoint": letter.checkpoint_key, "state": letter.state, "attempts": letter.attempts})
        changed.append(letter.checkpoint_key)
    if changed:
        if action == DeadLetterAction.RETRY:  # due at the next sweep, whatever its cadence or pending count
            repository.update_status(session, policy_id=policy.id, last_sweep_at=None)
        event_service.record(session, kind=f"replication.dead_letter.{action.value}", actor=actor,
                             reason=selection.reason, scope=_scope(policy.model, policy.session_class),
                             clock=clock, before={"dead_letters": before},
                             after={"state": target.value, "checkpoints": changed,
                                    "policy_revision": policy.revision})
    session.flush()
    return DeadLetterActionRead(model=policy.model, session_class=policy.session_class, action=action.value,
                                state=target, changed=changed, unchanged=unchanged)


def record_sweep(session: Session, *, policy_id: int, pending: int, oldest_pending_created_at: float | None,
                 clock: Clock) -> None:
    repository.update_status(session, policy_id=policy_id, last_sweep_at=clock.utcnow(), pending=pending,
                             oldest_pending_created_at=oldest_pending_created_at)


def record_replicated(session: Session, *, policy_id: int, blocks: int, lag_seconds: float | None,
                      clock: Clock) -> None:
    repository.count_replicated(session, policy_id=policy_id, blocks=blocks, last_replicated_at=clock.utcnow(),
                                last_lag_seconds=lag_seconds, last_error=None)


def record_session_records(session: Session, *, policy_id: int, lag_seconds: float, clock: Clock) -> None:
    """Session records reached the destination: their lag is the last copy's, as a checkpoint's would be
    (`lag_seconds` the status shows with nothing pending). Not a checkpoint: no count, no pending."""
    repository.update_status(session, policy_id=policy_id, last_replicated_at=clock.utcnow(),
                             last_lag_seconds=lag_seconds)


def record_already_present(session: Session, *, policy_id: int) -> None:
    repository.count_settled(session, policy_id=policy_id)


def record_deleted(session: Session, *, policy_id: int, deleted: int) -> None:
    if deleted:
        repository.count_deleted(session, policy_id=policy_id, deleted=deleted)


def record_error(session: Session, *, policy_id: int, error: str) -> None:
    repository.update_status(session, policy_id=policy_id, last_error=error[:2000])


def record_dead_letter(session: Session, *, policy_id: int, key: str, attempts: int, error: str,
                       clock: Clock) -> ReplicationDeadLetter | None:
    """Give up on one checkpoint: a dead letter row and a `replication.dead_letter` event (once per key).

    A retried letter whose copy failed again is dead again (with this failure's attempts and error);
    a dead or cleared one is left as it is.
    """
    policy = repository.get_policy_by_id(session, policy_id=policy_id)
    if policy is None:
        return None
    letter = repository.get_dead_letter(session, policy_id=policy_id, key=key)
    if letter is not None:
        if letter.state != DeadLetterState.RETRYING:
            return None
        now = clock.utcnow()
        if not repository.compare_and_set_dead_letter(
                session, letter_id=letter.id, expected_state=DeadLetterState.RETRYING,
                state=transition(letter.state, DeadLetterAction.FAILED).value, attempts=attempts,
                error=error[:2000], created_at=now, state_changed_at=now, state_changed_by="replication"):
            return None  # an operator cleared it meanwhile
        session.expire(letter)
    else:
        letter = ReplicationDeadLetter(policy_id=policy_id, checkpoint_key=key, attempts=attempts,
                                       error=error[:2000], created_at=clock.utcnow(),
                                       state=DeadLetterState.DEAD.value)
        session.add(letter)
    repository.update_status(session, policy_id=policy_id, last_error=error[:2000])
    repository.count_settled(session, policy_id=policy_id)
    event_service.record(session, kind="replication.dead_letter", actor="replication", reason=error[:2000],
                         scope=_scope(policy.model, policy.session_class), clock=clock, outcome="failed",
                         after={"checkpoint": key, "attempts": attempts, "policy_revision": policy.revision})
    session.flush()
    return letter


def lag_seconds(*, pending: int, oldest_pending_created_at: float | None, last_lag_seconds: float | None,
                now: float) -> float | None:
    """Pure: with checkpoints pending, how long the oldest has waited; otherwise the last copy's lag."""
    if pending and oldest_pending_created_at is not None:
        return max(0.0, now - oldest_pending_created_at)
    return last_lag_seconds


def status(session: Session, *, clock: Clock, model: str | None = None) -> ReplicationStatusRead:
    now = clock.wall()
    rows = []
    for policy in repository.list_policies(session, model=model):
        state = repository.get_status(session, policy_id=policy.id)
        pending = state.pending if state else 0
        lag = lag_seconds(pending=pending, oldest_pending_created_at=state.oldest_pending_created_at if state else None,
                          last_lag_seconds=state.last_lag_seconds if state else None, now=now)
        rows.append(ReplicationClassStatus(
            model=policy.model, session_class=policy.session_class, mode=ReplicationMode(policy.mode),
            revision=policy.revision, rpo_context_seconds=policy.rpo_context_seconds,
            last_sweep_at=state.last_sweep_at if state else None, pending=pending, lag_seconds=lag,
            within_rpo=None if lag is None or policy.mode == ReplicationMode.REBUILDABLE
            else lag <= policy.rpo_context_seconds,
            replicated_total=state.replicated_total if state else 0,
            blocks_copied_total=state.blocks_copied_total if state else 0,
            deleted_total=state.deleted_total if state else 0,
            last_replicated_at=state.last_replicated_at if state else None,
            last_lag_seconds=state.last_lag_seconds if state else None,
            last_error=state.last_error if state else None,
            dead_letters=[DeadLetterRead.model_validate(d)
                          for d in repository.dead_letters(session, policy_id=policy.id, states=REPORTED)]))
    return ReplicationStatusRead(policies=rows)
