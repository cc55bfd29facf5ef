"""Zonal shifts: take one zone out of routing until a mandatory expiry (≤ 72 h, ARC's rule).

A zonal shift is carried out by one cutover of the zone (target `out`):
the l7 tier (its clusters drain, so the snapshot's weight for the zone is
zero), the mesh tier where a driver is configured and has routes naming
the zone (their weights for it go to zero: the snapshot's mesh routes,
Istio), and the anycast tier when a driver is configured (the zone
withdraws the region's prefix). Ending it — by `cancel` or when
`expire_due` finds it due — rolls that cutover back, restoring the
recorded before-states, with the cutover's own events.

The shift and its expiry live in the database, so a control plane that
restarts finds every active shift and expires it on time: `expire_due` is
called by a background loop in the control-plane process (`ExpiryLoop`)
and, in tests, directly with a `ManualClock`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from common.errors import LifelineError
from common.logs import get_logger
from contract.routing_tier import RoutingTier
from controlplane.db import session_scope
from controlplane.event import service as event_service
from cutover import flows, repository
from cutover import service as cutover_service
from cutover.errors import InvalidExpiry, ZonalShiftActive, ZonalShiftEnded, ZonalShiftNotFound
from cutover.models import CutoverMode, ZonalShift
from cutover.scope import Scope, ScopeKind, TargetState
from cutover.policy import aware
from cutover.runtime import CutoverRuntime
from cutover.states import CutoverState

log = get_logger(__name__)

EXPIRY_ACTOR = "controlplane:zonal-shift-expiry"


def _scope(region: str, zone: str) -> str:
    return f"region:{region}/zone:{zone}"


def get_or_raise(session: Session, *, shift_id: int) -> ZonalShift:
    shift = repository.get_zonal_shift(session, shift_id=shift_id)
    if shift is None:
        raise ZonalShiftNotFound(f"no zonal shift #{shift_id}")
    return shift


def list_shifts(session: Session, *, active_only: bool = False) -> Sequence[ZonalShift]:
    return repository.list_zonal_shifts(session, active_only=active_only)


def start(
    runtime: CutoverRuntime, *, region: str, zone: str, expires_in: timedelta, reason: str, actor: str
) -> ZonalShift:
    """Plan and execute the zone's cutover; the shift ends by itself `expires_in` from now."""
    if expires_in <= timedelta(0) or expires_in > runtime.policy.max_zonal_shift:
        hours = runtime.policy.max_zonal_shift.total_seconds() / 3600
        raise InvalidExpiry(f"a zonal shift needs an expiry after 0 and at most {hours:g} h; got {expires_in}")
    clock = runtime.clock
    # l7 drains the zone's clusters; mesh takes its route weights to zero; anycast withdraws its prefix.
    tiers = [RoutingTier.L7] + [t for t in (RoutingTier.MESH, RoutingTier.ANYCAST) if runtime.drivers_for(t)]
    with session_scope(runtime.factory) as session:
        if (active := repository.active_zonal_shift(session, region=region, zone=zone)) is not None:
            raise ZonalShiftActive(f"zone {zone!r} of {region!r} is already shifted (#{active.id})")
        cutover, _ = cutover_service.plan(
            session, runtime, scope=Scope(ScopeKind.ZONE, region, zone), tiers=tiers,
            target_state=TargetState.OUT, reason=f"zonal shift: {reason}", mode=CutoverMode.MANUAL, actor=actor,
        )
        now = clock.utcnow()
        shift = ZonalShift(region=region, zone=zone, reason=reason, actor=actor, cutover_id=cutover.id,
                           started_at=now, expires_at=now + expires_in)
        try:
            with session.begin_nested():
                session.add(shift)
                session.flush()
        except IntegrityError as exc:
            raise ZonalShiftActive(f"zone {zone!r} of {region!r} was shifted concurrently") from exc
        event_service.record(
            session, kind="zonal_shift.start", actor=actor, reason=reason, scope=_scope(region, zone), clock=clock,
            after={"zonal_shift_id": shift.id, "cutover_id": cutover.id, "expires_at": shift.expires_at.isoformat(),
                   "tiers": [t.value for t in tiers]},
        )
        shift_id, cutover_id = shift.id, cutover.id
    try:
        done = flows.execute(runtime, cutover_id=cutover_id, idempotency_key=f"zonal-shift-{shift_id}", actor=actor)
    except LifelineError:
        _mark_ended(runtime, shift_id, end_reason="failed", actor=actor, reason="the shift's cutover was refused")
        raise
    if done.state != CutoverState.COMPLETED:
        _mark_ended(runtime, shift_id, end_reason="failed", actor=actor,
                    reason=f"the shift's cutover ended {done.state}: {done.failure}")
    with session_scope(runtime.factory) as session:
        return get_or_raise(session, shift_id=shift_id)


def _mark_ended(runtime: CutoverRuntime, shift_id: int, *, end_reason: str, actor: str, reason: str) -> bool:
    with session_scope(runtime.factory) as session:
        now = runtime.clock.utcnow()
        result = session.execute(
            update(ZonalShift).where(ZonalShift.id == shift_id, ZonalShift.ended_at.is_(None))
            .values(ended_at=now, end_reason=end_reason, ended_by=actor)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:
            return False
        shift = get_or_raise(session, shift_id=shift_id)
        event_service.record(
            session, kind=f"zonal_shift.{end_reason}" if end_reason != "cancelled" else "zonal_shift.cancel",
            actor=actor, reason=reason, scope=_scope(shift.region, shift.zone), clock=runtime.clock,
            before={"active": True, "expires_at": aware(shift.expires_at).isoformat()},
            after={"active": False, "zonal_shift_id": shift.id, "cutover_id": shift.cutover_id,
                   "end_reason": end_reason},
        )
        return True


def _end(runtime: CutoverRuntime, shift: ZonalShift, *, end_reason: str, actor: str, reason: str) -> ZonalShift:
    """Roll the shift's cutover back, then mark the shift ended (only once it is rolled back)."""
    with session_scope(runtime.factory) as session:
        cutover = cutover_service.get_or_raise(session, cutover_id=shift.cutover_id)
        state = CutoverState(cutover.state)
    if state != CutoverState.PLANNED:  # planned: a crash before execute changed nothing
        cutover = flows.rollback(runtime, cutover_id=shift.cutover_id, actor=actor, reason=reason)
        if cutover.state != CutoverState.ROLLED_BACK:
            log.error("zonal_shift_revert_failed", zonal_shift_id=shift.id, cutover_id=cutover.id,
                      state=cutover.state)
            with session_scope(runtime.factory) as session:
                return get_or_raise(session, shift_id=shift.id)  # still active: the next pass retries
    _mark_ended(runtime, shift.id, end_reason=end_reason, actor=actor, reason=reason)
    with session_scope(runtime.factory) as session:
        return get_or_raise(session, shift_id=shift.id)


def cancel(runtime: CutoverRuntime, *, shift_id: int, actor: str, reason: str) -> ZonalShift:
    with session_scope(runtime.factory) as session:
        shift = get_or_raise(session, shift_id=shift_id)
    if shift.ended_at is not None:
        raise ZonalShiftEnded(f"zonal shift #{shift_id} already ended ({shift.end_reason})")
    return _end(runtime, shift, end_reason="cancelled", actor=actor, reason=reason)


def expire_due(runtime: CutoverRuntime, now: datetime | None = None) -> list[int]:
    """End every active shift whose expiry has passed; returns the ids ended. Safe to call from any replica."""
    now = now or runtime.clock.utcnow()
    with session_scope(runtime.reads) as session:
        due = list(repository.due_zonal_shifts(session, now=now))
    ended = []
    for shift in due:
        try:
            result = _end(runtime, shift, end_reason="expired", actor=EXPIRY_ACTOR,
                          reason=f"zonal shift #{shift.id} expired at {aware(shift.expires_at).isoformat()}")
        except LifelineError as exc:  # another runner holds it, or it ended meanwhile: the next pass looks again
            log.info("zonal_shift_expiry_deferred", zonal_shift_id=shift.id, error=exc.error_type)
            continue
        if result.ended_at is not None:
            ended.append(shift.id)
    return ended


class ExpiryLoop:
    """Calls `expire_due` every `interval` in a daemon thread of the control-plane process."""

    def __init__(self, runtime: Callable[[], CutoverRuntime], *, interval: timedelta) -> None:
        self._runtime = runtime
        self._interval = interval.total_seconds()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="zonal-shift-expiry", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                expired = expire_due(self._runtime())
                if expired:
                    log.info("zonal_shifts_expired", ids=expired)
            except Exception as exc:  # the database may be down; the loop outlives it
                log.warning("zonal_shift_expiry_failed", error=repr(exc))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
