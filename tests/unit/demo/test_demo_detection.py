"""The demo's detection column: the system's own first routing event after the fault, never the script's step."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from lifeline.demo.scenarios import detection

FAULT = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)


def event(after_s: float, actor: str, tier: str | None = "dns") -> dict[str, object]:
    return {"routing_tier": tier, "actor": actor, "started_at": (FAULT + timedelta(seconds=after_s)).isoformat(),
            "scope": "region:eu-west", "reason": ""}


def test_a_cutover_the_script_posted_is_not_detection() -> None:
    script_only = [event(0.4, "token:demo-operator#2", "l7"), event(0.9, "token:demo-operator#2")]
    assert detection(script_only, FAULT) is None


def test_the_systems_first_event_after_the_fault_is() -> None:
    events = [event(-1.0, "agent:eu-west"), event(0.3, "token:demo-operator#2"), event(0.0, "no tier", None),
              event(1.25, "agent:us-east", "anycast"), event(2.0, "gateway:gw-us-east", "l7")]
    assert detection(events, FAULT) == pytest.approx(1.25)
