"""The control plane serves the capacity plan `lifeline pool plan` prints: same inputs, same numbers, same errors."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from warm_pool.cli import pool_app

INPUTS: dict[str, Any] = dict(region="eu-1", zones="a,b,c", demand_seqs=200, demand_tokens_per_s=5000,
                              context_tokens=1000, instance_seqs=32, instance_tokens_per_s=800,
                              instance_prefill_tokens_per_s=4000, headroom=1.2, recovery_target_s=10,
                              tier="warm", previous_version_share=0.25)


def cli(inputs: dict[str, Any], *extra: str) -> Any:
    args = ["plan", *[a for k, v in inputs.items() for a in (f"--{k.replace('_', '-')}", str(v))], *extra]
    return CliRunner().invoke(pool_app, args)


def test_the_api_serves_the_plan_the_cli_prints(client: TestClient, as_role: Any) -> None:
    viewer = as_role("viewer")
    printed = cli(INPUTS, "--json")
    assert printed.exit_code == 0, printed.output
    by_query = client.get("/api/v1/pool/plan", params=INPUTS, headers=viewer)
    by_body = client.post("/api/v1/pool/plan", json={**INPUTS, "zones": ["a", "b", "c"]}, headers=viewer)
    assert by_query.status_code == 200 and by_body.status_code == 200
    assert by_query.json() == by_body.json() == json.loads(printed.output)
    plan = by_query.json()
    # hand-worked in tests/unit/warm_pool/test_pool_capacity.py: N=8, serving [3,3,2], t=4, ⌈share × warm⌉
    assert [(z["zone"], z["serving"], z["warm"], z["warm_previous"]) for z in plan["zones"]] == [
        ("a", 3, 1, 1), ("b", 3, 1, 1), ("c", 2, 2, 1)]
    lines = {line["name"]: line for line in plan["arithmetic"]}
    assert lines["required serving N"]["formula"] == "max(8, 8, 1)" and lines["required serving N"]["value"] == 8
    assert lines["replay time"]["formula"] == "75000 ÷ 16375"
    assert {t["tier"]: t["survives_zone_loss"] for t in plan["tiers"]} == {"hot": True, "warm": True, "cold": False}
    repeated = client.get("/api/v1/pool/plan", params=[*[(k, v) for k, v in INPUTS.items() if k != "zones"],
                                                      ("zones", "a"), ("zones", "b"), ("zones", "c")], headers=viewer)
    assert repeated.json() == plan


@pytest.mark.parametrize(("change", "param", "says"), [
    ({"instance_seqs": 0}, "instance_seqs", "instance_seqs must be a finite number > 0"),
    ({"zones": "a"}, "zones", "two or more"),
    ({"zones": "a,a"}, "zones", "each zone once"),
    ({"headroom": 0.5}, "headroom", "headroom must be ≥ 1"),
    ({"recovery_target_s": 1e-9}, "recovery_target_s", "no plan up to"),
    ({"previous_version_share": 2}, "previous_version_share", "within [0, 1]"),
])
def test_a_plan_no_inputs_can_make_is_a_typed_422_naming_the_input_as_the_cli_does(
    client: TestClient, as_role: Any, change: dict[str, Any], param: str, says: str
) -> None:
    for response in (client.get("/api/v1/pool/plan", params={**INPUTS, **change}, headers=as_role("viewer")),
                     client.post("/api/v1/pool/plan", json={**INPUTS, **change}, headers=as_role("viewer"))):
        error = response.json()["error"]
        assert (response.status_code, error["type"], error["param"]) == (422, "invalid_request", param)
        assert says in error["message"]
    printed = cli({**INPUTS, **change})
    assert printed.exit_code == 2 and says.split()[0] in printed.output


def test_malformed_plan_requests_are_refused_and_only_people_read_plans(client: TestClient, as_role: Any) -> None:
    viewer = as_role("viewer")
    shapes = [
        ("GET", {**INPUTS, "surprise": "1"}), ("POST", {**INPUTS, "surprise": 1}),
        ("GET", {**INPUTS, "tier": "lukewarm"}), ("POST", {**INPUTS, "demand_seqs": "many"}),
        ("GET", {k: v for k, v in INPUTS.items() if k != "instance_seqs"}), ("POST", {**INPUTS, "zones": []}),
        ("GET", {**INPUTS, "region": "eu 1"}), ("POST", {**INPUTS, "zones": ["a", "b/c"]}),
        ("GET", {**INPUTS, "headroom": "nan"}),
    ]
    for method, inputs in shapes:
        response = (client.get("/api/v1/pool/plan", params=inputs, headers=viewer) if method == "GET" else
                    client.post("/api/v1/pool/plan", json=inputs, headers=viewer))
        assert (response.status_code, response.json()["error"]["type"]) == (422, "invalid_request"), inputs
    assert client.get("/api/v1/pool/plan", params=INPUTS).status_code == 401
    for machine in ("gateway",):
        assert client.get("/api/v1/pool/plan", params=INPUTS, headers=as_role(machine)).status_code == 403
    for person in ("operator", "admin"):
        assert client.post("/api/v1/pool/plan", json=INPUTS, headers=as_role(person)).status_code == 200


def test_the_plan_is_in_the_openapi_document(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    operations = doc["paths"]["/api/v1/pool/plan"]
    assert set(operations) == {"get", "post"}
    for operation in operations.values():
        assert operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/PlanRecord")
        assert {"401", "403", "422"} <= set(operation["responses"])
    query = {p["name"] for p in operations["get"]["parameters"]}
    assert set(INPUTS) <= query
    assert "arithmetic" in doc["components"]["schemas"]["PlanRecord"]["properties"]
