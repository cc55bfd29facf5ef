"""Zonal shifts: a zone out of routing until a mandatory expiry (≤ 72 h) that reverts it by itself."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from common.clock import ManualClock
from controlplane.db import session_scope
from controlplane.event import service as event_service
from controlplane.event.repository import EventFilter
from controlplane.snapshot import service as snapshot_service
from cutover import flows, zonal_shift
from cutover.errors import InvalidExpiry, ZonalShiftActive, ZonalShiftEnded
from cutover.drivers.snapshot_l7 import SnapshotL7Driver
from cutover.policy import aware
from cutover.runtime import CutoverRuntime
from tests.integration.cutover.test_cutover_support import (  # noqa: F401 - fixtures
    ScriptedDriver,
    policy,
    read_factory,
    runtime,
    scripted,
    topology_two_regions,
)

pytestmark = pytest.mark.usefixtures("topology_two_regions")

PREFIX = "203.0.113.1/32"


def zone_weights(runtime: CutoverRuntime) -> dict[str, int]:
    with session_scope(runtime.factory) as session:
        return snapshot_service.build(session)["tier_weights"]["m"]["eu"]


def kinds(runtime: CutoverRuntime, prefix: str) -> list[str]:
    with session_scope(runtime.factory) as session:
        return [e.kind for e in event_service.list_events(session, EventFilter(kind=None), limit=1000)
                if e.kind.startswith(prefix)]


def start(runtime: CutoverRuntime, hours: float = 2) -> Any:
    return zonal_shift.start(runtime, region="eu", zone="eu-a", expires_in=timedelta(hours=hours),
                             reason="eu-a packet loss", actor="op")


def test_a_shift_zeroes_the_zone_at_l7_and_withdraws_its_anycast_route(
    runtime: CutoverRuntime, scripted: ScriptedDriver, clock: ManualClock
) -> None:
    assert zone_weights(runtime) == {"eu-a": 100, "eu-b": 100}
    shift = start(runtime)
    assert shift.ended_at is None
    assert aware(shift.expires_at) == clock.utcnow() + timedelta(hours=2)
    assert zone_weights(runtime) == {"eu-a": 0, "eu-b": 100}
    assert scripted.announced == {PREFIX: False}
    with session_scope(runtime.factory) as session:
        from cutover import service

        cutover = service.get_or_raise(session, cutover_id=shift.cutover_id)
        assert (cutover.state, [s.tier for s in cutover.steps]) == ("completed", ["l7", "anycast"])
    assert kinds(runtime, "zonal_shift") == ["zonal_shift.start"]


@pytest.mark.parametrize("hours", [0, -1, 72.01, 24 * 30])
def test_the_expiry_is_mandatory_and_at_most_72_hours(runtime: CutoverRuntime, hours: float) -> None:
    with pytest.raises(InvalidExpiry):
        start(runtime, hours=hours)
    assert zone_weights(runtime) == {"eu-a": 100, "eu-b": 100}
    with session_scope(runtime.factory) as session:
        assert zonal_shift.list_shifts(session) == []


def test_exactly_72_hours_is_allowed(runtime: CutoverRuntime) -> None:
    assert start(runtime, hours=72).ended_at is None


def test_a_shift_reverts_by_itself_at_expiry(
    runtime: CutoverRuntime, scripted: ScriptedDriver, clock: ManualClock
) -> None:
    shift = start(runtime, hours=1)
    clock.advance(timedelta(minutes=59))
    assert zonal_shift.expire_due(runtime) == []
    assert zone_weights(runtime)["eu-a"] == 0
    clock.advance(timedelta(minutes=1))
    assert zonal_shift.expire_due(runtime) == [shift.id]
    assert zone_weights(runtime) == {"eu-a": 100, "eu-b": 100}
    assert scripted.announced == {PREFIX: True}
    with session_scope(runtime.factory) as session:
        ended = zonal_shift.get_or_raise(session, shift_id=shift.id)
        assert (ended.end_reason, ended.ended_by) == ("expired", zonal_shift.EXPIRY_ACTOR)
        assert zonal_shift.list_shifts(session, active_only=True) == []
    assert kinds(runtime, "zonal_shift") == ["zonal_shift.start", "zonal_shift.expired"]
    assert kinds(runtime, "cutover.rollback_step") == ["cutover.rollback_step"] * 2
    assert zonal_shift.expire_due(runtime) == []


def test_expiry_survives_a_control_plane_restart(
    runtime: CutoverRuntime, session_factory: Any, read_factory: Any, clock: ManualClock, scripted: ScriptedDriver
) -> None:
    shift = start(runtime, hours=3)
    # A new process: new drivers and runtime, nothing in memory but the database.
    restarted = CutoverRuntime(
        factory=session_factory, clock=clock, policy=runtime.policy,
        drivers=[SnapshotL7Driver(session_factory, read_factory=read_factory, clock=clock, sleep=clock.advance),
                 scripted],
    )
    clock.advance(timedelta(hours=3, seconds=1))
    assert zonal_shift.expire_due(restarted) == [shift.id]
    assert zone_weights(restarted) == {"eu-a": 100, "eu-b": 100}


def test_cancel_reverts_at_once_and_only_once(runtime: CutoverRuntime, scripted: ScriptedDriver) -> None:
    shift = start(runtime)
    cancelled = zonal_shift.cancel(runtime, shift_id=shift.id, actor="op", reason="packet loss gone")
    assert (cancelled.end_reason, cancelled.ended_by) == ("cancelled", "op")
    assert zone_weights(runtime)["eu-a"] == 100 and scripted.announced == {PREFIX: True}
    with pytest.raises(ZonalShiftEnded):
        zonal_shift.cancel(runtime, shift_id=shift.id, actor="op", reason="again")


def test_one_active_shift_per_zone(runtime: CutoverRuntime) -> None:
    start(runtime)
    with pytest.raises(ZonalShiftActive):
        start(runtime)


def test_a_shift_whose_cutover_cannot_verify_ends_failed_and_restores_the_zone(
    runtime: CutoverRuntime, scripted: ScriptedDriver
) -> None:
    scripted.never_verify.add(PREFIX)
    shift = start(runtime)
    assert shift.end_reason == "failed"
    assert zone_weights(runtime)["eu-a"] == 100
    assert kinds(runtime, "zonal_shift") == ["zonal_shift.start", "zonal_shift.failed"]


def test_a_shift_left_half_done_by_a_crash_is_undone_at_expiry(
    runtime: CutoverRuntime, scripted: ScriptedDriver, clock: ManualClock
) -> None:
    from tests.integration.cutover.test_cutover_support import SimulatedCrash

    scripted.crash_on_apply = PREFIX
    with pytest.raises(SimulatedCrash):
        start(runtime, hours=1)
    assert zone_weights(runtime)["eu-a"] == 0  # l7 done, anycast interrupted
    clock.advance(timedelta(hours=1))
    with session_scope(runtime.factory) as session:
        (shift,) = zonal_shift.list_shifts(session, active_only=True)
    assert zonal_shift.expire_due(runtime) == [shift.id]
    assert zone_weights(runtime)["eu-a"] == 100
    with session_scope(runtime.factory) as session:
        from cutover import service

        assert service.get_or_raise(session, cutover_id=shift.cutover_id).state == "rolled_back"
    assert flows.rollback(runtime, cutover_id=shift.cutover_id, actor="op", reason="again").state == "rolled_back"


def test_the_control_planes_expiry_loop_ends_due_shifts(
    runtime: CutoverRuntime, clock: ManualClock
) -> None:
    import time
    from types import SimpleNamespace

    from cutover.endpoints import start_expiry_loop

    shift = start(runtime, hours=1)
    state = SimpleNamespace(cutover_runtime=CutoverRuntime(
        factory=runtime.factory, clock=clock, drivers=runtime.drivers,
        policy=type(runtime.policy)(expiry_interval=timedelta(milliseconds=20)),
    ))
    loop = start_expiry_loop(state)
    try:
        clock.advance(timedelta(hours=1))
        deadline = time.monotonic() + 20
        while True:
            with session_scope(runtime.factory) as session:
                if zonal_shift.get_or_raise(session, shift_id=shift.id).ended_at is not None:
                    break
            assert time.monotonic() < deadline, "the loop did not end the due shift"
            time.sleep(0.05)
    finally:
        loop.stop()
    assert zone_weights(runtime)["eu-a"] == 100
