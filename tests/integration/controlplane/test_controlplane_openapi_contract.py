"""The published OpenAPI document is the contract: the answers of the API conform to it.

Over a fleet seeded through the API (`tests.support.controlplane_seed`), on
SQLite and PostgreSQL:

- every GET operation, with and without a token: the status is one the
  operation lists, and the body validates against that status's schema;
- every other operation, with requests generated from the document
  (valid and invalid, schemathesis on hypothesis): the same two checks.

Operations that verify against the real data plane (executing, rolling back
or aborting a cutover, zonal shifts, escalations: they wait for gateways
that report to apply the snapshot) are covered by their own suites and left
out here, so this stays fast. The never-5xx fuzz is test_controlplane_schemathesis.py.

Every answer any integration test gets through the control-plane client
is judged the same way by the client itself (tests/support/answer_contract.py);
this test is what makes sure every operation is reached, with rows and
with generated bodies, whatever the other suites happen to call.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from common.clock import ManualClock
from controlplane.topology.lease import InMemoryLeaseReader
from tests.integration.controlplane.test_controlplane_timestamps_walk import PER_ROUTE, QUERY
from tests.support.controlplane_seed import seed_fleet

pytestmark = pytest.mark.long  # scheduled first in its tier (tests/conftest.py)

MAX_EXAMPLES = 6  # per operation and mode
WAITS_ON_THE_DATA_PLANE = re.compile(r"^/api/v1/(cutovers/\{cutover_id\}/|zonal-shifts|cutover-escalations)")


@pytest.fixture
def api(client: TestClient, as_role: Any, session_factory: Any, clock: ManualClock,
        lease_reader: InMemoryLeaseReader, tmp_path: Path) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    seeded = seed_fleet(client, as_role, session_factory=session_factory, clock=clock, lease_reader=lease_reader,
                        tmp_path=tmp_path)
    return schemathesis.openapi.from_asgi("/openapi.json", client.app), seeded, client.get("/openapi.json").json()


def violations(operation: Any, document: dict[str, Any], response: Any, where: str) -> list[str]:
    listed = document["paths"][operation.path][operation.method.lower()]["responses"]
    found = []
    if str(response.status_code) not in listed and "default" not in listed:
        found.append(f"{where}: status {response.status_code} is not in the document ({sorted(listed)}): "
                     f"{response.text[:160]}")
    try:
        operation.validate_response(response)
    except Exception as failure:  # noqa: BLE001 - schemathesis raises one per violation, or a group of them
        found.append(f"{where}: {response.status_code} body violates its schema: {str(failure)[:300]}")
    return found


def test_every_get_answer_is_one_the_document_describes(
    client: TestClient, as_role: Any, api: tuple[Any, dict[str, Any], dict[str, Any]]
) -> None:
    schema, seeded, document = api
    admin, found, checked = as_role("admin"), [], 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.method.upper() != "GET" or not operation.path.startswith("/api/"):
            continue
        values = {**seeded, **PER_ROUTE.get(operation.path, {})}
        url = re.sub(r"{(\w+)}", lambda m: str(values[m.group(1)]), operation.path)
        for headers, params in ((admin, QUERY.get(operation.path)), ({}, None), (as_role("gateway"), None)):
            response = client.get(url, params=params, headers=headers)
            found += violations(operation, document, response, f"GET {url}")
            checked += 1
    assert found == [], "\n".join(found)
    assert checked >= 90


def test_generated_requests_get_answers_the_document_describes(
    as_role: Any, api: tuple[Any, dict[str, Any], dict[str, Any]]
) -> None:
    schema, _, document = api
    headers = as_role("admin")
    found: list[str] = []
    calls: list[int] = []
    # Revoking tokens last: a generated revoke may hit the admin token in use, and later calls would see only 401.
    operations = sorted((result.ok() for result in schema.get_all_operations()),
                        key=lambda op: op.path.endswith("/revoke"))
    operations = [op for op in operations if op.method.upper() != "GET" and op.path.startswith("/api/")
                  and not WAITS_ON_THE_DATA_PLANE.match(op.path)]
    assert len(operations) >= 25
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                      database=None, phases=[Phase.generate])
            def exercise(case: Any) -> None:
                response = case.call(headers=headers)
                calls.append(response.status_code)
                found.extend(violations(operation, document, response,
                                        f"{case.method} {case.formatted_path} ({mode.value})"))

            try:
                exercise()
            except Unsatisfiable:
                if mode is GenerationMode.POSITIVE:
                    raise
    assert found == [], "\n".join(sorted(set(found))[:40])
    assert len(calls) > 150 and any(code < 300 for code in calls)


def test_a_json_body_that_is_not_utf8_is_a_documented_422(client: TestClient, as_role: Any) -> None:
    response = client.post("/api/v1/regions", content=b'{"name": "\xff"}',
                           headers={**as_role("operator"), "content-type": "application/json"})
    assert response.status_code == 422
    assert (response.json()["error"]["type"], response.json()["error"]["param"]) == ("invalid_request", "body")
    assert client.get("/api/v1/regions", headers=as_role("viewer")).json() == []  # nothing changed
