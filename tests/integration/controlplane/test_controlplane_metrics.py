"""The control plane's Prometheus page: every answer counted by route template, on both databases."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families


def requests_total(client: TestClient) -> dict[tuple[str, str, str], float]:
    page = client.get("/metrics")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
    return {(s.labels["method"], s.labels["route"], s.labels["status"]): s.value
            for family in text_string_to_metric_families(page.text) if family.name == "lifeline_controlplane_requests"
            for s in family.samples if s.name == "lifeline_controlplane_requests_total"}


def test_requests_are_counted_by_route_template_and_status(client: TestClient, as_role: Any) -> None:
    viewer = as_role("viewer")
    assert client.get("/api/v1/regions", headers=viewer).status_code == 200
    assert client.get("/api/v1/regions").status_code == 401
    assert client.get("/api/v1/clusters/no-such-cluster", headers=viewer).status_code == 404
    counted = requests_total(client)
    assert counted[("GET", "/api/v1/regions", "200")] == 1
    assert counted[("GET", "/api/v1/regions", "401")] == 1
    assert counted[("GET", "/api/v1/clusters/{name}", "404")] == 1  # the template, not the name asked for


def test_a_scanner_walking_random_paths_adds_one_series_not_one_per_path(client: TestClient) -> None:
    before = requests_total(client)
    for n in range(40):
        assert client.get(f"/wp-admin/{n}/setup.php").status_code == 404
    after = requests_total(client)
    assert after[("GET", "unmatched", "404")] == 40
    assert set(after) - set(before) - {("GET", "/metrics", "200")} == {("GET", "unmatched", "404")}


def test_a_refused_oversized_body_is_counted_too(client: TestClient, as_role: Any, settings: Any) -> None:
    body = b"x" * (settings.max_request_bytes + 1)
    response = client.post("/api/v1/regions", content=body, headers={**as_role("operator"),
                                                                     "content-type": "application/json"})
    assert response.status_code == 413
    assert sum(v for (method, _, status), v in requests_total(client).items()
               if (method, status) == ("POST", "413")) == 1
