"""A drill's fault is stamped when it took effect, and detection is measured from there."""

from __future__ import annotations

import pytest

from common.clock import ManualClock
from controlplane.drill import measure
from controlplane.drill.runner import stamp_fault


def test_the_fault_is_stamped_after_its_action_returned() -> None:
    clock = ManualClock()
    before = clock.now()
    # The hang fault's action: two admin round trips of 20 ms each before the engine hangs.
    fault_at, fault_wall, injection_s = stamp_fault(clock, lambda: clock.advance(0.04))
    assert fault_at == pytest.approx(before + 0.04)
    assert fault_wall == pytest.approx(clock.wall())
    assert injection_s == pytest.approx(0.04)


def test_detection_is_the_first_event_at_or_after_the_fault() -> None:
    assert measure.detection([-5.0, 0.012, 0.3]) == pytest.approx(0.012)
    assert measure.detection([]) is None
    assert measure.detection([-0.5]) is None  # another fault's event


def test_an_event_written_while_the_action_still_ran_counts_as_immediate() -> None:
    # A zone's first engine was suppressed before the last kill returned: the fault had landed for it.
    assert measure.detection([-0.02, 0.4], injection_s=0.03) == 0.0
    assert measure.detection([-0.05, 0.4], injection_s=0.03) == pytest.approx(0.4)


def test_only_events_since_the_fault_are_responses_to_it() -> None:
    # the drill before's tail, shipped late by a loaded data plane, is in the window but is not this fault's
    assert not measure.since_fault(-1.2)
    assert measure.since_fault(0.0) and measure.since_fault(3.0)
    assert measure.since_fault(-0.02, injection_s=0.03) and not measure.since_fault(-0.05, injection_s=0.03)
