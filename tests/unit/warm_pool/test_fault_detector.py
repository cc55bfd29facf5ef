"""Zone and region faults from probe rounds, on virtual time: blips, a zone down, the region, recovery, flapping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from warm_pool.fault import GONE, FaultDetector, Observation, escalation_body

T0 = datetime(2026, 12, 1, 7, 0, tzinfo=UTC)
ROUND = timedelta(seconds=0.5)
# two zones of two instances each; a round is written as the verdicts of a1 a2 b1 b2 ("-" = not in view)
NAMES = (("a1", "za"), ("a2", "za"), ("b1", "zb"), ("b2", "zb"))
SHORT = {"ok": "ok", "err": "error", "to": "timeout", "gone": GONE, "drain": "draining", "load": None,
         "wrong": "wrong_output", "429": "overloaded"}

UP = "ok ok ok ok"
ZA_DOWN = "err to ok ok"
ALL_DOWN = "err err to to"


def _round(spec: str) -> list[Observation]:
    return [Observation(name, zone, SHORT[v], f"scripted {v}", generation=1)
            for (name, zone), v in zip(NAMES, spec.split(), strict=True) if v != "-"]


def _run(rounds: list[str], *, n: int = 3, clear: int = 3) -> list[tuple[int, str, str]]:
    """Feed the rounds; (round index, opened|cleared, scope) in order."""
    detector = FaultDetector("eu", rounds=n, clear_rounds=clear, source="agent:eu")
    seen = []
    for index, spec in enumerate(rounds):
        result = detector.observe(_round(spec), T0 + index * ROUND)
        seen += [(index, "opened", f.scope) for f in result.opened]
        seen += [(index, "cleared", f.scope) for f in result.cleared]
    return seen


ZA, EU = "region:eu/zone:za", "region:eu"


@pytest.mark.parametrize(("rounds", "expected"), [
    pytest.param([UP] * 3 + [ZA_DOWN] + [UP] * 5, [], id="one-round-blip"),
    pytest.param([UP] + [ZA_DOWN] * 2 + [UP] * 5, [], id="blip-shorter-than-N"),
    pytest.param([UP] + [ZA_DOWN] * 3, [(3, "opened", ZA)], id="zone-down-N-rounds"),
    pytest.param([UP] + [ZA_DOWN] * 10, [(3, "opened", ZA)], id="a-persisting-fault-opens-once"),
    pytest.param([UP] + ["err ok ok ok"] * 6, [], id="one-instance-of-the-zone-down-is-no-zone-fault"),
    pytest.param([UP] + ["err drain ok ok"] * 6, [], id="a-draining-member-is-not-failing"),
    pytest.param([UP] + [ALL_DOWN] * 5, [(3, "opened", EU)], id="whole-region-down-is-a-region-fault-only"),
    pytest.param([UP] + ["err err to ok"] * 4, [(3, "opened", ZA)], id="other-zone-partly-healthy-suffices"),
    pytest.param([UP] + [ZA_DOWN] * 3 + [UP] * 3, [(3, "opened", ZA), (6, "cleared", ZA)], id="recovery-clears"),
    pytest.param([UP] + [ZA_DOWN] * 3 + [UP] * 3 + [ZA_DOWN] * 3,
                 [(3, "opened", ZA), (6, "cleared", ZA), (9, "opened", ZA)], id="a-fault-that-returns-is-new"),
    pytest.param([UP] + [ZA_DOWN, UP] * 6, [], id="flapping-each-round-never-opens"),
    pytest.param([UP] + [ZA_DOWN] * 2 + [UP] + [ZA_DOWN] * 2 + [UP], [], id="flapping-under-N-never-opens"),
    pytest.param([UP] + [ZA_DOWN] * 3 + [UP, ZA_DOWN] * 4, [(3, "opened", ZA)],
                 id="flapping-after-a-fault-keeps-it-open-not-a-new-one"),
    pytest.param([UP] + [ZA_DOWN] * 3 + [ALL_DOWN] * 3, [(3, "opened", ZA), (6, "opened", EU)],
                 id="zone-then-region"),
    pytest.param([UP] + ["gone gone ok ok", "- - ok ok", "- - ok ok"], [(3, "opened", ZA)],
                 id="processes-gone-count-as-failing"),
    pytest.param([UP] + ["err err ok ok", "- - ok ok", "- - ok ok"], [(3, "opened", ZA)],
                 id="failing-then-out-of-view-is-gone"),
    pytest.param([UP] + ["- - ok ok"] * 5, [], id="healthy-ones-retired-are-a-clean-departure"),
    pytest.param(["load load ok ok"] + ["err err ok ok"] * 5, [], id="never-healthy-instances-prove-nothing"),
    pytest.param([UP] + ["wrong wrong ok ok"] * 5, [], id="wrong-output-is-not-a-zone-fault"),
    pytest.param([UP] + ["429 err ok ok"] * 5, [], id="an-overloaded-member-answers"),
    pytest.param(["err err err err"] * 6, [], id="nothing-ever-healthy-nothing-to-lose"),
])
def test_fault_detection(rounds: list[str], expected: list[tuple[int, str, str]]) -> None:
    assert _run(rounds) == expected


def test_a_zone_fault_names_its_instances_verdicts_rounds_and_times() -> None:
    detector = FaultDetector("eu", rounds=3, source="agent:eu")
    detector.observe(_round(UP), T0)
    opened = []
    for index in range(1, 4):
        opened += detector.observe(_round(ZA_DOWN), T0 + index * ROUND).opened
    [fault] = opened
    assert fault.fault_id == "agent:eu:region:eu:zone:za:20261201T070000.500000Z"
    evidence = fault.evidence
    assert [(i["instance_id"], i["verdict"], i["failing_since"]) for i in evidence["instances"]] == [
        ("a1", "error", (T0 + ROUND).isoformat()), ("a2", "timeout", (T0 + ROUND).isoformat())]
    assert evidence["rounds"] == 3 and evidence["rounds_required"] == 3
    assert evidence["first_failed_at"] == (T0 + ROUND).isoformat()
    assert evidence["detected_at"] == (T0 + 3 * ROUND).isoformat()
    assert evidence["healthy_zones"] == {"zb": ["b1", "b2"]}
    assert escalation_body(fault) == {"fault_id": fault.fault_id, "scope": {"kind": "zone", "region": "eu",
                                                                            "name": "za"}, "evidence": evidence}


def test_a_region_fault_is_reported_at_region_scope() -> None:
    detector = FaultDetector("eu", rounds=2, source="agent:eu")
    detector.observe(_round(UP), T0)
    detector.observe(_round(ALL_DOWN), T0 + ROUND)
    [fault] = detector.observe(_round(ALL_DOWN), T0 + 2 * ROUND).opened
    assert escalation_body(fault)["scope"] == {"kind": "region", "region": "eu"}
    assert sorted(i["instance_id"] for i in fault.evidence["instances"]) == ["a1", "a2", "b1", "b2"]


@pytest.mark.parametrize(("rounds", "clear"), [(1, 3), (0, 3), (3, 0)])
def test_a_single_round_can_never_be_configured_a_fault(rounds: int, clear: int) -> None:
    with pytest.raises(ValueError):
        FaultDetector("eu", rounds=rounds, clear_rounds=clear)
