"""Every timestamp the API writes carries a UTC offset: a walk over the OpenAPI document's GET routes.

Not a check per field: the fleet is seeded through the API (topology,
leases, an ejection, gateway and agent reports, data-plane events, two
catalog versions with aliases and an issue, an executed cutover, a zonal
shift, a mesh route, drills and a run, a replication policy), then every
GET operation the published document lists is called, with path
parameters filled from the seed, and every string in every answer that
reads as an ISO-8601 date-time must end in `Z` or `±HH:MM`. A route added
later is walked without anyone listing it; one the seed cannot fill fails
the walk until it is named in `NOT_SEEDED` with the reason.

SQLite is the database that stores datetimes as naive text, so the walk is
about it; it runs on PostgreSQL too, where it costs little.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.topology.lease import InMemoryLeaseReader
from tests.support.controlplane_seed import seed_fleet

# "2026-01-01T00:00:00", with a date-time separator and at least minutes: what an ISO-8601 date-time starts with.
DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?")
WITH_OFFSET = re.compile(r"(Z|[+-]\d{2}:\d{2})$")
PER_ROUTE = {"/api/v1/drills/{name}": {"name": "kill-one"}}  # where one parameter name means two things
QUERY = {"/api/v1/pool/plan": {  # required query parameters
    "region": "eu", "zones": "eu-a,eu-b", "demand_seqs": 200, "demand_tokens_per_s": 5000, "context_tokens": 1000,
    "instance_seqs": 32, "instance_tokens_per_s": 800, "instance_prefill_tokens_per_s": 4000, "headroom": 1.2,
    "recovery_target_s": 10, "tier": "warm", "previous_version_share": 0.25}}
# GET operations whose answers hold no row the seed can make; each says why.
NOT_SEEDED = {
    "/api/v1/replication/dead-letters": "a dead letter needs a checkpoint copy that failed its retries "
                                        "(tests/integration/replication/test_replication_dead_letters.py)",
}


def offsetless(value: Any, where: str = "$") -> list[str]:
    """Every string under `value` that reads as a date-time and has no UTC offset, with its JSON path."""
    if isinstance(value, dict):
        return [bad for key, item in value.items() for bad in offsetless(item, f"{where}.{key}")]
    if isinstance(value, list):
        return [bad for index, item in enumerate(value) for bad in offsetless(item, f"{where}[{index}]")]
    if isinstance(value, str):
        if DATE_TIME.fullmatch(value.rstrip("Z")) or (DATE_TIME.match(value) and len(value) <= 40):
            if not WITH_OFFSET.search(value):
                return [f"{where} = {value!r}"]
    return []


def answer_body(response: Any) -> Any:
    kind = response.headers.get("content-type", "")
    if "json" in kind and "ndjson" not in kind:
        return response.json()
    lines = [line for line in response.text.splitlines() if line.strip()]
    try:
        return [json.loads(line) for line in lines]
    except ValueError:
        return [found.group(0) for found in re.finditer(r"\S*" + DATE_TIME.pattern + r"\S*", response.text)]


@pytest.fixture
def seeded(client: TestClient, as_role: Any, session_factory: Any, clock: ManualClock,
           lease_reader: InMemoryLeaseReader, tmp_path: Path) -> dict[str, Any]:
    return seed_fleet(client, as_role, session_factory=session_factory, clock=clock, lease_reader=lease_reader,
                      tmp_path=tmp_path)


def test_every_get_route_answers_timestamps_with_a_utc_offset(
    client: TestClient, as_role: Any, seeded: dict[str, Any]
) -> None:
    admin = as_role("admin")
    paths = client.get("/openapi.json").json()["paths"]
    walked, empty, offenders = [], [], []
    for template, operations in sorted(paths.items()):
        if "get" not in operations or not template.startswith("/api/"):
            continue
        values = {**seeded, **PER_ROUTE.get(template, {})}
        url = re.sub(r"{(\w+)}", lambda m: str(values[m.group(1)]), template)
        response = client.get(url, params=QUERY.get(template), headers=admin)
        assert response.status_code == 200, (template, response.status_code, response.text[:300])
        body = answer_body(response)
        walked.append(template)
        if body in ([], {}, None) and template not in NOT_SEEDED:
            empty.append(template)
        offenders += [f"GET {url}: {bad}" for bad in offsetless(body)]
    assert offenders == [], "\n".join(offenders)
    assert empty == [], "the seed leaves these answers empty, so their timestamps went unchecked"
    assert len(walked) >= 30  # the document lists the routes; a walk that found few read the wrong one


@pytest.mark.parametrize("value", ["2026-01-01T00:00:00", "2026-01-01 00:00:00.5", "2026-01-01T00:00"])
def test_the_walk_finds_a_naive_timestamp(value: str) -> None:
    assert offsetless({"rows": [{"at": value}]}) == [f"$.rows[0].at = {value!r}"]


@pytest.mark.parametrize("value", ["2026-01-01T00:00:00Z", "2026-01-01T02:00:00+02:00", "2026-01-01", "v1", "eu-a"])
def test_the_walk_passes_aware_timestamps_and_other_strings(value: str) -> None:
    assert offsetless([value]) == []
