"""Local ejection backs off by consecutive failures, as Envoy's outlier detection, and never empties a fleet."""

from __future__ import annotations

from datetime import timedelta

from common.clock import ManualClock
from gateway.outlier import OutlierDetector
from gateway.settings import OutlierConfig

FLEET = [(f"e{i}", 1) for i in range(4)]


def _detector(**config) -> tuple[OutlierDetector, ManualClock]:
    clock = ManualClock()
    return OutlierDetector(OutlierConfig(**config), clock), clock


def test_one_transient_500_per_engine_ejects_nothing():
    outliers, _ = _detector()
    for key in FLEET:
        assert not outliers.failure(key, "http_500", peers=FLEET)
    assert not any(outliers.ejected(key) for key in FLEET)


def test_consecutive_5xx_eject_and_a_success_resets_the_count():
    outliers, _ = _detector(consecutive_5xx=3)
    e0 = FLEET[0]
    outliers.failure(e0, "http_500", peers=FLEET)
    outliers.failure(e0, "http_503", peers=FLEET)
    outliers.success(e0)
    assert not outliers.failure(e0, "http_500", peers=FLEET)  # 1 in a row again, not 3
    outliers.failure(e0, "engine_error", peers=FLEET)
    assert outliers.failure(e0, "http_500", peers=FLEET)
    assert outliers.ejected(e0)


def test_ejection_time_grows_with_repeats_and_is_capped():
    outliers, clock = _detector(consecutive_5xx=1, base_ejection_time=timedelta(seconds=5),
                                max_ejection_time=timedelta(seconds=12))
    e0 = FLEET[0]
    durations = []
    for _ in range(4):
        assert outliers.failure(e0, "http_500", peers=FLEET)
        start = clock.now()
        while outliers.ejected(e0):
            clock.advance(0.5)
        durations.append(clock.now() - start)
    assert durations == [5.0, 10.0, 12.0, 12.0]


def test_a_healthy_spell_after_an_ejection_forgets_a_step():
    outliers, clock = _detector(consecutive_5xx=1, base_ejection_time=timedelta(seconds=5))
    e0 = FLEET[0]
    outliers.failure(e0, "http_500", peers=FLEET)
    clock.advance(5.1 + 5.1)  # ejection over, then one more base time healthy
    outliers.success(e0)
    outliers.failure(e0, "http_500", peers=FLEET)
    start = clock.now()
    while outliers.ejected(e0):
        clock.advance(0.5)
    assert clock.now() - start == 5.0  # back to the first step


def test_5xx_ejections_are_capped_and_never_take_the_last_endpoint():
    outliers, _ = _detector(consecutive_5xx=1, max_ejection_percent=50.0)
    assert outliers.failure(FLEET[0], "http_500", peers=FLEET)
    assert outliers.failure(FLEET[1], "http_500", peers=FLEET)
    assert not outliers.failure(FLEET[2], "http_500", peers=FLEET)  # 3 of 4 would be over 50 %
    alone = [("solo", 1)]
    lonely, _ = _detector(consecutive_5xx=1, max_ejection_percent=100.0)
    assert not lonely.failure(alone[0], "http_500", peers=alone)  # never the last one


def test_a_failed_connection_ejects_at_once_whatever_the_cap():
    outliers, _ = _detector(max_ejection_percent=0.0)
    assert outliers.failure(FLEET[0], "connect", peers=FLEET)
    assert outliers.failure(FLEET[1], "connection_lost", peers=FLEET)


def test_a_slow_engine_is_ejected_at_once_but_within_the_cap_so_a_busy_survivor_stays_routable():
    """A connect timeout or a stall shows an engine slow, not gone: the dead peer's streams arriving at a
    loaded survivor must not eject the last engine there is (seen with two vLLMs on two cores)."""
    pair = FLEET[:2]
    outliers, _ = _detector(max_ejection_percent=50.0)
    assert outliers.failure(pair[0], "connection_lost", peers=pair)  # the dead one: out at once
    assert not outliers.failure(pair[1], "timeout", peers=pair)  # the survivor, slow to accept: kept
    assert not outliers.failure(pair[1], "stall", peers=pair)
    assert not outliers.ejected(pair[1])
    fleet, _ = _detector(max_ejection_percent=50.0)
    assert fleet.failure(FLEET[0], "stall", peers=FLEET)  # with room under the cap: at once, no count to reach
    assert fleet.failure(FLEET[1], "timeout", peers=FLEET)
    assert not fleet.failure(FLEET[2], "timeout", peers=FLEET)


def test_a_new_generation_starts_clean():
    outliers, _ = _detector()
    assert outliers.failure(("e0", 1), "connect", peers=FLEET)
    assert not outliers.ejected(("e0", 2))
