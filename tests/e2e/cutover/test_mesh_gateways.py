"""The mesh tier end to end: real control plane, gateway and engines; cohorts, a version split, a zone cut over.

`lifeline controlplane serve` (SQLite) holds two versions of the tiny
model (prod seed0, canary seed1); one gateway routes by its snapshot; eng-0
serves seed0 in zone local-a, eng-1 seed1 in local-b (bench/snapshot_propagation's
fleet). Mesh routes go through `PUT /api/v1/mesh-routes` and a mesh cutover
of local-b through `POST /api/v1/cutovers`: its step verifies only once the
gateway reports it applied the snapshot (a fresh gateway report).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.snapshot_propagation import MODEL, PROMPT, REGION, SnapshotFleet, answer
from common import oneshot_http
from lifeline.processes import built_model

SEED0, SEED1 = "tiny-seed0", "tiny-seed1"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SnapshotFleet]:
    versions = {p.name: p for p in (built_model("tiny", 0), built_model("tiny", 1))}
    fleet = SnapshotFleet(tmp_path_factory.mktemp("mesh-fleet"), versions)
    try:
        fleet.start_controlplane({"prod": SEED0, "canary": SEED1})
        fleet.api("POST", f"/regions/{REGION}/zones", json={"name": "local-b"})
        gateway = fleet.start_gateway("gw-mesh")
        fleet.start_engine("eng-0", SEED0, zone="local-a")
        fleet.start_engine("eng-1", SEED1, zone="local-b")
        gateway.wait_routable(MODEL, 1)
        gateway.wait_routable(f"{MODEL}:canary", 1)
        yield fleet
    finally:
        fleet.close()


@pytest.fixture(scope="module")
def reference(fleet: SnapshotFleet) -> dict[str, tuple[int, ...]]:
    tokens = {v: answer(fleet.gateways[0].url, v) for v in (SEED0, SEED1)}
    assert None not in tokens.values() and tokens[SEED0] != tokens[SEED1]
    return tokens  # type: ignore[return-value]


def _ask(fleet: SnapshotFleet, model: str = MODEL, **headers: str) -> tuple[int, ...] | None:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    response = oneshot_http.post(f"{fleet.gateways[0].url}/v1/completions", json=body, timeout=30,
                                 headers={k.replace("_", "-"): v for k, v in headers.items()})
    return tuple(response.json()["choices"][0]["token_ids"]) if response.status_code == 200 else None


def _route(fleet: SnapshotFleet, destinations: list[dict], cohort: str | None = None) -> int:
    fleet.api("PUT", "/mesh-routes", json={"model": MODEL, "cohort": cohort, "destinations": destinations,
                                           "reason": "e2e"})
    return fleet.snapshot_version()


def _applied(fleet: SnapshotFleet, version: int) -> None:
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        reports = fleet.api("GET", "/gateways").json()
        if reports and all((r.get("snapshot_version") or 0) >= version for r in reports):
            return
        time.sleep(0.1)
    raise AssertionError(f"the gateway never reported snapshot {version}")


def test_cohort_header_and_version_weights_pick_the_version(fleet: SnapshotFleet, reference: dict) -> None:
    _route(fleet, [{"version": SEED0, "weight": 100}])
    _applied(fleet, _route(fleet, [{"version": SEED1, "weight": 100}], cohort="canary"))
    assert _ask(fleet) == reference[SEED0]
    assert _ask(fleet, x_lifeline_cohort="canary") == reference[SEED1]
    assert _ask(fleet, x_lifeline_cohort="nobody") == reference[SEED0]  # no route of its own: the default
    _applied(fleet, _route(fleet, [{"version": SEED0, "weight": 0}, {"version": SEED1, "weight": 100}]))
    assert {_ask(fleet, x_client_id=f"client-{i}") for i in range(5)} == {reference[SEED1]}
    assert _ask(fleet, f"{MODEL}:prod") == reference[SEED0]  # a pinned alias is not split


def test_mesh_cutover_of_a_zone_takes_its_instances_out_and_rollback_returns_them(
        fleet: SnapshotFleet, reference: dict) -> None:
    _applied(fleet, _route(fleet, [{"version": SEED0, "zone": "local-a", "weight": 50},
                                   {"version": SEED1, "zone": "local-b", "weight": 50}]))
    assert _ask(fleet, f"{MODEL}:canary") == reference[SEED1]
    plan = fleet.api("POST", "/cutovers", json={"scope": {"kind": "zone", "region": REGION, "name": "local-b"},
                                                "tier": "mesh", "reason": "e2e: local-b degraded"}).json()
    done = fleet.api("POST", f"/cutovers/{plan['id']}/execute", json={"idempotency_key": "e2e"}).json()
    assert done["state"] == "completed", done
    evidence = done["steps"][0]["evidence"]
    assert evidence["gateway_versions"] == {"gw-mesh": evidence["snapshot_version"]}  # the gateway's own report
    assert {_ask(fleet, x_client_id=f"client-{i}") for i in range(5)} == {reference[SEED0]}
    assert _ask(fleet, f"{MODEL}:canary") is None  # seed1 lives only in local-b, whose mesh weight is 0
    back = fleet.api("POST", f"/cutovers/{plan['id']}/rollback", json={"reason": "e2e: back"}).json()
    assert back["state"] == "rolled_back", back
    assert _ask(fleet, f"{MODEL}:canary") == reference[SEED1]
