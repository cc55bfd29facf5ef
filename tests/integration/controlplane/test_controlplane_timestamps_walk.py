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
about it; it runs on PostgreSQL too, where it costs little. The walk makes
sure every GET route is reached with rows in its answer; every other
answer of the suite (POST, PATCH, PUT, DELETE, refusals) is held to the
same `offsetless` rule by the client's answer contract
(tests/support/answer_contract.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.topology.lease import InMemoryLeaseReader
from tests.support.answer_contract import answer_body, offsetless
from tests.support.controlplane_seed import seed_fleet

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
