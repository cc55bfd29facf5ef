"""Hostile JSON bodies the schema checks let through: each is a 422 naming the field, and stores nothing.

Found by a sweep that sent valid bodies with one value swapped for
something hostile, on SQLite and PostgreSQL. Before the fixes:

- a lone UTF-16 surrogate (`"\\ud800"`) in a nested string or a dict key was
  stored, then every read of the report answered 500 (it has no UTF-8 form);
- `NaN`, `Infinity` and `1e400` (Python's JSON reads all three) were 201 on
  SQLite and a 422 on PostgreSQL, and read back as `null`;
- a timestamp whose offset carries it past year 1 or 9999 in UTC was a 500
  at the insert, and a timestamp without an offset a 500 at the clock-skew check.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock

JSON = {"Content-Type": "application/json"}


def gateway_report(at: str, endpoint_id: str = "e1", applied_at: str | None = None) -> str:
    applied = f'"{applied_at}"' if applied_at else "null"
    return ('{"replica_id": "gw-1", "region": "eu", "zone": "eu-a", "routing_source": "snapshot", '
            f'"snapshot_version": 1, "snapshot_applied_at": {applied}, "reported_at": "{at}", '
            f'"live_endpoints": [{{"instance_id": "{endpoint_id}", "generation": 3, "version": "v1", "zone": "eu-a"}}]}}')


def agent_report(at: str) -> str:
    return f'{{"region": "eu", "agent_id": "host-1:42", "sent_at": "{at}", "instances": []}}'


def event_batch(at: str, detail: str = "{}") -> str:
    return ('{"events": [{"kind": "instance.suppressed", "actor": "gateway:gw-1", "region": "eu", '
            f'"instance_id": "e1", "generation": 3, "reason": "refused", "at": "{at}", "detail": {detail}}}]}}')


def drill(extra: str) -> str:
    return ('{"name": "d", "model": "llama", "scope": "region", "fault": "controlplane_down", '
            f'"blast_radius": {{"region": "eu"}}, {extra}}}')


def assert_refused(response: Any, param: str | None) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request"
    assert error["param"] == param, error


def assert_nothing_stored(client: TestClient, as_role: Any) -> None:
    viewer = as_role("viewer")
    assert client.get("/api/v1/gateways", headers=viewer).json() == []
    assert client.get("/api/v1/events", headers=viewer).json() == []
    assert client.get("/api/v1/drills", headers=viewer).json() == []


@pytest.mark.parametrize(("path", "method", "role", "raw", "param"), [
    ("/api/v1/gateways/gw-1", "PUT", "gateway", gateway_report("2026-01-01T00:00:00Z", endpoint_id="\\ud800"),
     "live_endpoints.0.instance_id"),
    ("/api/v1/events/dataplane", "POST", "gateway", event_batch("2026-01-01T00:00:00Z", '{"\\udfff": "x"}'),
     "events.0.detail.\udfff".encode("utf-8", "backslashreplace").decode()),
    ("/api/v1/drills", "POST", "operator", drill('"description": "ok \\ud83d"'), "description"),
])
def test_a_lone_surrogate_anywhere_is_a_422_naming_it(
    client: TestClient, as_role: Any, path: str, method: str, role: str, raw: str, param: str
) -> None:
    response = client.request(method, path, content=raw.encode(), headers={**as_role(role), **JSON})
    assert_refused(response, param)
    assert_nothing_stored(client, as_role)


@pytest.mark.parametrize(("path", "role", "raw", "param"), [
    ("/api/v1/drills", "operator", drill('"stop_conditions": {"ttft_p99_ms": Infinity}'), "stop_conditions.ttft_p99_ms"),
    ("/api/v1/drills", "operator", drill('"traffic": {"token_delay_ms": 1e400}'), "traffic.token_delay_ms"),
    ("/api/v1/drills", "operator", drill('"targets": {"rto_latency_s": -Infinity}'), "targets.rto_latency_s"),
    ("/api/v1/events/dataplane", "gateway", event_batch("2026-01-01T00:00:00Z", '{"lag": NaN}'),
     "events.0.detail.lag"),
])
def test_nan_and_infinity_are_a_422_on_both_databases(
    client: TestClient, as_role: Any, path: str, role: str, raw: str, param: str
) -> None:
    response = client.post(path, content=raw.encode(), headers={**as_role(role), **JSON})
    assert_refused(response, param)
    assert_nothing_stored(client, as_role)


@pytest.mark.parametrize(("path", "method", "raw"), [
    ("/api/v1/events/dataplane", "POST", event_batch("0001-01-01T00:00:00+23:00")),
    ("/api/v1/events/dataplane", "POST", event_batch("9999-12-31T23:59:59-23:00")),
    ("/api/v1/gateways/gw-1", "PUT", gateway_report("0001-01-01T00:00:00+23:00")),
    ("/api/v1/gateways/gw-1", "PUT", gateway_report("2026-01-01T00:00:00Z", applied_at="9999-12-31T23:59:59-23:00")),
    ("/api/v1/agents/eu", "PUT", agent_report("0001-01-01T00:00:00+23:00")),
])
def test_a_timestamp_past_the_storable_range_in_utc_is_a_422(
    client: TestClient, as_role: Any, path: str, method: str, raw: str
) -> None:
    role = "admin" if "agents" in path else "gateway"  # an admin may report as the region's agent
    response = client.request(method, path, content=raw.encode(), headers={**as_role(role), **JSON})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["type"] == "invalid_request"
    assert_nothing_stored(client, as_role)
    assert client.get("/api/v1/agents", headers=as_role("viewer")).json() == []


def test_a_report_timestamp_without_an_offset_is_taken_as_utc(
    client: TestClient, as_role: Any, clock: ManualClock
) -> None:
    naive = clock.utcnow().replace(tzinfo=None).isoformat()
    response = client.put("/api/v1/gateways/gw-1", content=gateway_report(naive).encode(),
                          headers={**as_role("gateway"), **JSON})
    assert response.status_code == 200, response.text
    [shown] = client.get("/api/v1/gateways", headers=as_role("viewer")).json()
    assert datetime.fromisoformat(shown["reported_at"]) == clock.utcnow().astimezone(UTC)
    agent = client.put("/api/v1/agents/eu", content=agent_report(naive).encode(), headers={**as_role("admin"), **JSON})
    assert agent.status_code == 200, agent.text
    [region] = client.get("/api/v1/agents", headers=as_role("viewer")).json()
    assert datetime.fromisoformat(region["sent_at"]) == clock.utcnow().astimezone(UTC)


def test_the_api_keeps_answering_after_every_hostile_body(client: TestClient, as_role: Any) -> None:
    for raw in (drill('"traffic": {"token_delay_ms": NaN}'), drill('"description": "\\udc00"')):
        assert client.post("/api/v1/drills", content=raw.encode(), headers={**as_role("operator"), **JSON}).status_code == 422
    ok = client.post("/api/v1/drills", content=drill('"description": "fine \\u00e9"').encode(),
                     headers={**as_role("operator"), **JSON})
    assert ok.status_code == 201, ok.text
    assert client.get("/api/v1/drills/d", headers=as_role("viewer")).json()["description"] == "fine é"
