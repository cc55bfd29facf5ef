"""Two gateways route by the control plane's snapshot, on real processes (issue 8, gateway side).

Promote and rollback reach both gateways; with the control plane down they
serve (and restart) from the snapshot on disk and catch up when it returns;
an invalid snapshot is refused by both; snapshot ejections and the gateways'
own L7 ejections reach the control plane as events and reports.

The control plane is `bench/controlplane_standin.py` (the contract's
endpoints in their own process) until `lifeline controlplane serve` serves
contract snapshots and the report/event endpoints.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from bench.snapshot_propagation import MODEL, SnapshotFleet, answer, wait_answer
from lifeline.processes import built_model

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SnapshotFleet]:
    versions = {p.name: p for p in (built_model("tiny", 0), built_model("tiny", 1))}
    fleet = SnapshotFleet(tmp_path_factory.mktemp("snapshot-fleet"), versions)
    try:
        fleet.start_controlplane()
        fleet.publish({"prod": "tiny-seed0", "canary": "tiny-seed1"})
        for replica in ("gw-a", "gw-b"):
            fleet.start_gateway(replica)
        fleet.start_engine("eng-0", "tiny-seed0")
        fleet.start_engine("eng-1", "tiny-seed1")
        for gateway in fleet.gateways:
            gateway.wait_routable(MODEL, 1)
            gateway.wait_routable(f"{MODEL}:canary", 1)
        yield fleet
    finally:
        fleet.close()


@pytest.fixture(scope="module")
def reference(fleet: SnapshotFleet) -> dict[str, tuple[int, ...]]:
    tokens = {v: answer(fleet.gateways[0].url, v) for v in ("tiny-seed0", "tiny-seed1")}
    assert None not in tokens.values() and tokens["tiny-seed0"] != tokens["tiny-seed1"]  # answers name their version
    return tokens  # type: ignore[return-value]


def _until(condition: Callable[[], object], timeout: float = 20.0, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.1)
    raise AssertionError(f"never happened within {timeout:.0f}s: {what}")


def _reports(fleet: SnapshotFleet) -> dict[str, dict]:
    return {g["replica_id"]: g for g in httpx.get(f"{fleet.cp_url}/api/v1/gateways", timeout=5).json()["gateways"]}


def _every_gateway_reports(fleet: SnapshotFleet, predicate: Callable[[dict], bool]) -> bool:
    reports = _reports(fleet)
    return all(g.replica_id in reports and predicate(reports[g.replica_id]) for g in fleet.gateways)


def test_promote_and_rollback_take_effect_at_both_gateways(fleet, reference):
    for target in ("tiny-seed1", "tiny-seed0"):  # promote, then roll back
        version = fleet.publish({"prod": target, "canary": "tiny-seed1"})
        for gateway in fleet.gateways:
            wait_answer(gateway.url, MODEL, reference[target])
        # Each replica reports the applied version, so a cutover step can verify the L7 change.
        reports = _until(lambda: (r := _reports(fleet)) and all(
            r.get(g.replica_id, {}).get("snapshot_version") == version for g in fleet.gateways) and r,
            what=f"both gateways report snapshot {version}")
        for report in reports.values():  # type: ignore[union-attr]
            assert report["routing_source"] == "snapshot"
            # Only what the snapshot routes to: after the promote nothing names seed0, so eng-0 is not listed.
            expected = {"eng-0", "eng-1"} if target == "tiny-seed0" else {"eng-1"}
            assert {e["instance_id"] for e in report["live_endpoints"]} == expected


def test_gateways_serve_from_disk_while_the_control_plane_is_down_and_catch_up(fleet, reference):
    fleet.publish({"prod": "tiny-seed0", "canary": "tiny-seed1"})
    for gateway in fleet.gateways:
        wait_answer(gateway.url, MODEL, reference["tiny-seed0"])
    fleet.stop_controlplane()
    a, b = fleet.gateways
    assert answer(a.url, MODEL) == reference["tiny-seed0"]
    fleet.restart_gateway(b)  # a cold start with the control plane away: only the disk copy to go on
    b.wait_routable(MODEL, 1)
    assert answer(b.url, MODEL) == reference["tiny-seed0"]
    assert answer(b.url, f"{MODEL}:canary") == reference["tiny-seed1"]

    fleet.start_controlplane()  # it returns (empty state, then the operator's newer snapshot)
    fleet.publish({"prod": "tiny-seed1", "canary": "tiny-seed1"})
    for gateway in fleet.gateways:
        wait_answer(gateway.url, MODEL, reference["tiny-seed1"])


def test_an_invalid_snapshot_is_refused_by_both_and_the_old_one_stays(fleet, reference):
    good = fleet.publish({"prod": "tiny-seed1", "canary": "tiny-seed1"})
    _until(lambda: _every_gateway_reports(fleet, lambda r: r["snapshot_version"] == good),
           what=f"both gateways apply snapshot {good}")
    bad = fleet.snapshot_body({"prod": "tiny-seed0", "canary": "tiny-seed1"}, good + 1)
    bad["models"][MODEL]["aliases"]["prod"]["version"] = "tiny-seed9"  # names a version it does not describe
    fleet.snapshot_version = good + 1
    fleet.publish_raw(json.dumps(bad).encode(), good + 1)

    refused = _until(lambda: {e["actor"] for e in fleet.controlplane_state()["events"]
                              if e["kind"] == "snapshot.refused" and e["routing_tier"] == "l7"} >= {"gateway:gw-a", "gateway:gw-b"},
                     what="both gateways send snapshot.refused")
    assert refused
    for gateway in fleet.gateways:
        assert answer(gateway.url, MODEL) == reference["tiny-seed1"]
        assert json.loads((fleet.workdir / gateway.replica_id / "snapshot.json").read_text())["version"] == good
    assert _every_gateway_reports(fleet, lambda r: r["snapshot_version"] == good)


def test_a_snapshot_ejection_removes_the_instance_at_both_gateways(fleet, reference):
    fleet.snapshot_version += 1
    body = fleet.snapshot_body({"prod": "tiny-seed0", "canary": "tiny-seed1"}, fleet.snapshot_version)
    body["ejections"] = [{"region": "local", "instance_id": "eng-1", "generation": None, "reason": "bad canary"}]
    fleet.publish_raw(json.dumps(body).encode(), fleet.snapshot_version)
    for gateway in fleet.gateways:
        wait_answer(gateway.url, MODEL, reference["tiny-seed0"])
        refused = httpx.post(f"{gateway.url}/v1/completions", json={"model": f"{MODEL}:canary", "prompt": "x", "max_tokens": 2}, timeout=10)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "no_healthy_endpoint"
    _until(lambda: _every_gateway_reports(fleet, lambda r: r["ejected"] == 1 and r["snapshot_version"] == fleet.snapshot_version),
           what="both gateways report one ejected instance")


def test_a_gateways_own_ejection_is_an_l7_event(fleet, reference):
    fleet.publish({"prod": "tiny-seed0", "canary": "tiny-seed1"})
    gateway = fleet.gateways[0]
    wait_answer(gateway.url, f"{MODEL}:canary", reference["tiny-seed1"])
    victim = next(e for e in fleet.engines if e.instance_id == "eng-1")
    victim.kill(signal.SIGKILL)  # its lease is still live for up to a TTL: the gateway finds out by connecting
    httpx.post(f"{gateway.url}/v1/completions", json={"model": f"{MODEL}:canary", "prompt": "x", "max_tokens": 2}, timeout=30)
    event = _until(lambda: next((e for e in fleet.controlplane_state()["events"]
                                 if e["kind"] == "instance.suppressed" and e["instance_id"] == "eng-1"), None),
                   what="the gateway's ejection of eng-1 reaches the control plane")
    assert event["actor"] == f"gateway:{gateway.replica_id}" and event["routing_tier"] == "l7"  # type: ignore[index]
    assert event["reason"] and event["generation"] is not None  # type: ignore[index]
