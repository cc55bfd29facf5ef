"""Console sign-in, sessions, CSRF, roles, and the fleet, catalog, cutover and event pages (TestClient, SQLite)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from contract.events import GatewayReport
from contract.lease import Lease
from controlplane.auth import service as auth_service
from controlplane.auth.models import AuditRecord
from controlplane.auth.roles import MACHINES
from controlplane.db import session_scope
from controlplane.event import service as event_service
from controlplane.event.repository import EventFilter
from controlplane.gateway_report import service as gateway_report_service
from controlplane.topology.lease import InMemoryLeaseReader
from tests.integration.console.conftest import csrf_of, sign_in
from tests.support.answer_contract import AnswerContract
from tests.support.controlplane_testing import ON_SQLITE
from weight_catalog import aliases as catalog_aliases
from weight_catalog import service as catalog_service
from weight_catalog.store import open_store

pytestmark = ON_SQLITE


def audit_rows(session_factory: Any) -> list[tuple[str, str, str, int | None]]:
    with session_factory() as session:
        return [(r.actor, r.action, r.outcome, r.status_code)
                for r in session.query(AuditRecord).order_by(AuditRecord.id)]


# --- sign-in, session, CSRF ---------------------------------------------------------------------------------------

def test_pages_redirect_to_sign_in_without_a_session(console: TestClient) -> None:
    for page in ("/console/fleet", "/console/catalog", "/console/cutovers", "/console/events"):
        response = console.get(page, follow_redirects=False)
        assert response.status_code == 303
        assert response.headers["location"].startswith("/console/sign-in?next=")


def test_sign_in_sets_a_strict_httponly_session_cookie(console: TestClient, tokens: dict[str, str]) -> None:
    form = console.get("/console/sign-in")
    signin_csrf = form.text.split('name="signin_csrf" value="')[1].split('"')[0]
    response = console.post("/console/sign-in", data={"token": tokens["viewer"], "signin_csrf": signin_csrf,
                                                      "next": "/console/catalog"}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/console/catalog"
    cookie = [h for h in response.headers.get_list("set-cookie") if h.startswith("lifeline_console=")][0]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    assert "Secure" not in cookie  # plain HTTP here; see the TLS test
    assert tokens["viewer"] not in cookie  # the bearer secret never travels in the cookie
    assert "default-src 'none'" in response.headers["content-security-policy"]


def test_the_cookie_is_secure_when_served_over_tls(settings: Any, session_factory: Any, clock: ManualClock,
                                                   lease_reader: InMemoryLeaseReader, tokens: dict[str, str],
                                                   answer_contract: AnswerContract) -> None:
    from controlplane.app import create_app
    app = create_app(settings, clock=clock, lease_reader=lease_reader)
    with answer_contract.watch(TestClient(app, base_url="https://testserver")) as client:
        form = client.get("/console/sign-in")
        assert "Secure" in form.headers["set-cookie"]
        signin_csrf = form.text.split('name="signin_csrf" value="')[1].split('"')[0]
        response = client.post("/console/sign-in", data={"token": tokens["viewer"], "signin_csrf": signin_csrf},
                               follow_redirects=False)
        assert "Secure" in response.headers["set-cookie"]


def test_sign_in_refuses_a_bad_token_and_a_missing_csrf(console: TestClient, tokens: dict[str, str],
                                                         gateway_token: str, session_factory: Any,
                                                         clock: ManualClock) -> None:
    form = console.get("/console/sign-in")
    signin_csrf = form.text.split('name="signin_csrf" value="')[1].split('"')[0]
    bad = console.post("/console/sign-in", data={"token": "llt_nope", "signin_csrf": signin_csrf})
    assert bad.status_code == 401 and "unknown or revoked" in bad.text
    machine = console.post("/console/sign-in", data={"token": gateway_token,
                                                     "signin_csrf": console.cookies["lifeline_console_signin"]})
    assert machine.status_code == 401  # a gateway token is for gateways, not for a browser
    for role in sorted(MACHINES):  # every machine role, not only the first one written
        with session_scope(session_factory) as session:
            _, secret = auth_service.create_token(session, name=f"{role}-signin", role=role, created_by="test",
                                                  clock=clock)
        refused = console.post("/console/sign-in", data={"token": secret,
                                                         "signin_csrf": console.cookies["lifeline_console_signin"]})
        assert refused.status_code == 401 and "machine tokens" in refused.text, role
    no_csrf = console.post("/console/sign-in", data={"token": tokens["admin"]})
    assert no_csrf.status_code == 403 and "csrf_failed" in no_csrf.text
    assert "lifeline_console" not in console.cookies


def test_session_expires_and_dies_with_its_token(console: TestClient, tokens: dict[str, str], clock: ManualClock,
                                                 session_factory: Any) -> None:
    sign_in(console, tokens["operator"])
    assert console.get("/console/fleet", follow_redirects=False).status_code == 200
    clock.t += 8 * 3600 + 1
    assert console.get("/console/fleet", follow_redirects=False).status_code == 303

    sign_in(console, tokens["operator"])
    with session_scope(session_factory) as session:
        auth_service.revoke_token(session, token_id=2, actor="test", clock=clock)
    assert console.get("/console/fleet", follow_redirects=False).status_code == 303


def test_a_forged_or_tampered_cookie_is_refused(console: TestClient, tokens: dict[str, str]) -> None:
    sign_in(console, tokens["viewer"])
    value = console.cookies["lifeline_console"]
    token_id, expires, nonce, mac = value.split(".")
    console.cookies.clear()
    # Claim the admin token (id 3) with the viewer's MAC, or extend the expiry: both fail the MAC.
    for forged in (f"3.{expires}.{nonce}.{mac}", f"{token_id}.{int(expires) + 10**6}.{nonce}.{mac}", "junk"):
        console.cookies.set("lifeline_console", forged, path="/console")
        assert console.get("/console/fleet", follow_redirects=False).status_code == 303
        console.cookies.clear()


def test_sign_out_needs_csrf_and_ends_the_session(console: TestClient, tokens: dict[str, str]) -> None:
    csrf = sign_in(console, tokens["viewer"])
    assert console.post("/console/sign-out", data={}).status_code == 403
    assert console.get("/console/fleet", follow_redirects=False).status_code == 200
    out = console.post("/console/sign-out", data={"csrf_token": csrf}, follow_redirects=False)
    assert out.status_code == 303
    assert console.get("/console/fleet", follow_redirects=False).status_code == 303


def test_sign_in_never_redirects_off_the_console(console: TestClient, tokens: dict[str, str]) -> None:
    form = console.get("/console/sign-in?next=//evil.example/x")
    signin_csrf = form.text.split('name="signin_csrf" value="')[1].split('"')[0]
    response = console.post("/console/sign-in", data={"token": tokens["viewer"], "signin_csrf": signin_csrf,
                                                      "next": "https://evil.example/"}, follow_redirects=False)
    assert response.headers["location"] == "/console/fleet"


def report(session_factory: Any, clock: ManualClock, replica: str, version: int, epoch: str | None = "ours") -> None:
    """A gateway's report; `epoch` "ours" is this database's, as a gateway that applied our snapshot sends."""
    from controlplane.routing_version import service as routing_version

    with session_scope(session_factory) as session:
        if epoch == "ours":
            epoch = routing_version.current_epoch(session)
        gateway_report_service.store(session, replica_id=replica, report=GatewayReport(
            replica_id=replica, region="eu", zone="eu-a", routing_source="snapshot", snapshot_version=version,
            snapshot_epoch=epoch, snapshot_applied_at=clock.utcnow(), reported_at=clock.utcnow()),
            actor="test", clock=clock)


# --- fleet ---------------------------------------------------------------------------------------------------------

@pytest.mark.usefixtures("topology_eu")
def test_fleet_shows_instances_and_gateways_and_marks_stale_ones(
    console: TestClient, tokens: dict[str, str], lease_reader: InMemoryLeaseReader, clock: ManualClock,
    session_factory: Any,
) -> None:
    now = clock.wall()
    # the lease expiring after 62 s more stays live; the other has already lapsed
    lease_reader.put(Lease(region="eu", instance_id="engine-1", generation=3, url="http://127.0.0.1:9001",
                           version="v2", zone="eu-a", expires_at=now + 100))
    lease_reader.put(Lease(region="eu", instance_id="engine-2", generation=1, url="http://127.0.0.1:9002",
                           version="v1", zone="eu-b", expires_at=now - 1))
    report(session_factory, clock, "gw-fresh", 7)
    clock.t += 62  # past the 30 s stale_after: gw-fresh's report is now stale
    report(session_factory, clock, "gw-old", 5)
    sign_in(console, tokens["viewer"])
    page = console.get("/console/fleet").text
    fresh_row = page.split('data-testid="gateway-gw-fresh"')[1].split("</tr>")[0]
    old_row = page.split('data-testid="gateway-gw-old"')[1].split("</tr>")[0]
    assert "v7" in fresh_row and "stale" in fresh_row
    assert "v5" in old_row and "current" in old_row and "stale" not in old_row
    live = page.split('data-testid="instance-engine-1"')[1].split("</tr>")[0]
    lapsed = page.split('data-testid="instance-engine-2"')[1].split("</tr>")[0]
    assert ">3<" in live and "v2" in live and "live" in live and "stale" not in live
    assert "lapsed" in lapsed and "stale" in lapsed
    assert 'data-testid="cluster-c-eu-a"' in page and "serving" in page


def agent_report(session_factory: Any, clock: ManualClock, region: str, instances: list[dict[str, Any]],
                 epoch: str | None = "ours") -> None:
    """The region's agent's report, stored as `PUT /api/v1/agents/{region}` stores it; `epoch` as in `report`."""
    from contract.events import AgentReport
    from controlplane.agent_report import service as agent_report_service
    from controlplane.routing_version import service as routing_version

    with session_scope(session_factory) as session:
        if epoch == "ours":
            epoch = routing_version.current_epoch(session)
        agent_report_service.store(session, region=region, actor="test", clock=clock, report=AgentReport(
            region=region, agent_id=f"agent-{region}", sent_at=clock.utcnow(), snapshot_version=4,
            snapshot_epoch=epoch, instances=instances))


@pytest.mark.usefixtures("topology_eu")
def test_fleet_shows_the_agents_verdicts_pool_and_canary_and_marks_them_stale_with_the_report(
    console: TestClient, tokens: dict[str, str], lease_reader: InMemoryLeaseReader, clock: ManualClock,
    session_factory: Any, settings: Any,
) -> None:
    now = clock.wall()
    lease_reader.put(Lease(region="eu", instance_id="engine-1", generation=3, url="http://127.0.0.1:9001",
                           version="v2", zone="eu-a", expires_at=now + 600))
    lease_reader.put(Lease(region="eu", instance_id="engine-9", generation=1, url="http://127.0.0.1:9009",
                           version="v2", zone="eu-b", expires_at=now + 600))
    agent_report(session_factory, clock, "eu", [
        {"instance_id": "engine-1", "zone": "eu-a", "version": "v2", "url": "http://127.0.0.1:9001",
         "origin": "pool", "pool_state": "serving", "verdict": "timeout", "verdict_reason": "no first token in 2 s",
         "verdict_since": clock.utcnow(), "lease_held": True, "lease_generation": 3, "canary_verdict": "ok",
         "canary_at": clock.utcnow(), "canaries": 4},
        {"instance_id": "pool-3", "zone": "eu-b", "version": "v2", "url": "http://127.0.0.1:9003",
         "origin": "pool", "pool_state": "warm"},
    ])
    report(session_factory, clock, "gw-ours", 9)
    report(session_factory, clock, "gw-elsewhere", 40, epoch="0f0f0f0f-dead-4bee-8bad-000000000099")
    sign_in(console, tokens["viewer"])

    def rows(html: str) -> dict[str, str]:
        found = {}
        for key in ("instance-engine-1", "instance-engine-9", "agent-instance-pool-3", "gateway-gw-ours",
                    "gateway-gw-elsewhere"):
            found[key] = html.split(f'data-testid="{key}"')[1].split("</tr>")[0]
        found["agent"] = html.split('data-testid="agent-eu"')[1].split("</p>")[0]
        found["us"] = html.split('data-testid="agent-us"')[1].split("</p>")[0]
        return found

    current = rows(console.get("/console/fleet").text)
    engine = current["instance-engine-1"]
    assert "serving" in engine and "timeout" in engine and "no first token in 2 s" in engine
    assert "agent holds lease g3" in engine and ">ok<" in engine and "(4 answered)" in engine and "stale" not in engine
    assert "not probed by the agent" in current["instance-engine-9"]
    assert "warm" in current["agent-instance-pool-3"] and "not probed yet" in current["agent-instance-pool-3"]
    assert "agent-eu" in current["agent"] and "current" in current["agent"] and "v4" in current["agent"]
    assert "No agent has reported" in current["us"]
    assert "current" in current["gateway-gw-ours"]
    assert "other control plane" in current["gateway-gw-elsewhere"] and "current" not in current["gateway-gw-elsewhere"]

    clock.t += settings.agent_report_stale_after.total_seconds() + 1  # the agent went quiet
    stale = rows(console.get("/console/fleet").text)
    for cell in ("pool", "verdict", "canary"):
        shown = stale["instance-engine-1"].split(f'data-testid="{cell}"')[1].split("</td>")[0]
        assert "stale" in shown, (cell, shown)  # each value drawn from the old report says so, none passes as now
    assert "stale" in stale["agent-instance-pool-3"] and "stale" in stale["agent"] and "current" not in stale["agent"]
    assert "timeout" in stale["instance-engine-1"]  # still the last verdict it sent, marked, not hidden


@pytest.mark.usefixtures("topology_eu")
def test_an_agent_on_another_control_planes_snapshot_is_not_shown_as_current(
    console: TestClient, tokens: dict[str, str], clock: ManualClock, session_factory: Any,
) -> None:
    agent_report(session_factory, clock, "eu", [], epoch="0f0f0f0f-dead-4bee-8bad-000000000099")
    sign_in(console, tokens["viewer"])
    agent = console.get("/console/fleet").text.split('data-testid="agent-eu"')[1].split("</p>")[0]
    assert "other control plane" in agent and "current" not in agent
    listed = console.get("/api/v1/agents", headers={"Authorization": f"Bearer {tokens['viewer']}"}).json()
    assert [(a["region"], a["foreign_epoch"]) for a in listed] == [("eu", True)]


@pytest.mark.usefixtures("topology_eu")
def test_the_live_fleet_body_is_refreshed_by_polling_and_stops_with_the_session(
    console: TestClient, tokens: dict[str, str], lease_reader: InMemoryLeaseReader, clock: ManualClock,
    session_factory: Any,
) -> None:
    assert console.get("/console/fleet/live").status_code == 401  # no session: nothing to swap in
    sign_in(console, tokens["operator"])
    page = console.get("/console/fleet").text
    assert 'id="fleet-live"' in page and 'hx-get="/console/fleet/live"' in page and 'hx-trigger="every 2s"' in page
    assert 'data-testid="instance-engine-5"' not in page
    lease_reader.put(Lease(region="eu", instance_id="engine-5", generation=2, url="http://127.0.0.1:9005",
                           version="v1", zone="eu-b", expires_at=clock.wall() + 600))
    body = console.get("/console/fleet/live")
    assert body.status_code == 200 and body.headers["cache-control"] == "no-store"
    assert body.text.lstrip().startswith('<div id="fleet-live"') and "<html" not in body.text
    assert 'data-testid="instance-engine-5"' in body.text  # the engine that just leased, without a reload
    assert 'hx-trigger="every 2s"' in body.text  # the swapped-in body keeps polling
    with session_scope(session_factory) as session:
        auth_service.revoke_token(session, token_id=2, actor="test", clock=clock)
    assert console.get("/console/fleet/live").status_code == 401  # a revoked token's open page stops updating


@pytest.mark.usefixtures("topology_eu")
def test_fleet_says_when_the_lease_registry_is_down(console: TestClient, tokens: dict[str, str]) -> None:
    from controlplane.topology.errors import LeaseRegistryUnavailable

    class DownRegistry:
        def list_instances(self, region: str) -> list[Lease]:
            raise LeaseRegistryUnavailable("redis at 127.0.0.1:1 does not answer")

    console.app.state.lease_reader = DownRegistry()  # type: ignore[attr-defined]
    sign_in(console, tokens["viewer"])
    page = console.get("/console/fleet").text
    assert "Lease registry unavailable" in page and "lease_registry_unavailable" in page


# --- catalog -------------------------------------------------------------------------------------------------------

def register(session_factory: Any, clock: ManualClock, root: Path, version: str, *, eos: int = 2) -> None:
    location = root / version
    location.mkdir(parents=True)
    (location / "config.json").write_text(json.dumps({"architectures": ["Tiny"], "hidden_size": 8}))
    (location / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}, "eos": eos}))
    (location / "model.safetensors").write_bytes(version.encode() * 64)
    scan = catalog_service.scan_artifact(open_store(str(location)), workers=1)
    with session_scope(session_factory) as session:
        catalog_service.create_version(session, model="tiny", version=version, scan=scan, actor="test", clock=clock)


@pytest.fixture
def catalog_two_versions(session_factory: Any, clock: ManualClock, tmp_path: Path) -> None:
    register(session_factory, clock, tmp_path / "artifacts", "v1")
    register(session_factory, clock, tmp_path / "artifacts", "v2")
    with session_scope(session_factory) as session:
        catalog_aliases.promote(session, model="tiny", alias="prod", version="v1", actor="test", reason="first",
                                clock=clock)


@pytest.mark.usefixtures("catalog_two_versions")
def test_viewer_sees_the_catalog_but_no_action_and_the_server_refuses_it_anyway(
    console: TestClient, tokens: dict[str, str], session_factory: Any,
) -> None:
    csrf = sign_in(console, tokens["viewer"])
    page = console.get("/console/catalog").text
    assert 'data-testid="alias-tiny-prod"' in page and "v1" in page
    assert "fingerprint" in page and "tokenizer" in page and "never verified" in page
    assert "<form method=\"post\" action=\"/console/catalog" not in page and "Promote</button>" not in page
    refused = console.post("/console/catalog/tiny/promote",
                           data={"csrf_token": csrf, "alias": "prod", "version": "v2", "reason": "try"})
    assert refused.status_code == 403 and "forbidden" in refused.text
    with session_factory() as session:
        assert catalog_aliases.get_alias_or_raise(session, model="tiny", name="prod").revision == 1
    assert audit_rows(session_factory)[-1] == ("token:test-viewer#1", "console.catalog_promote", "failed", 403)


@pytest.mark.usefixtures("catalog_two_versions")
def test_operator_promotes_through_the_catalog_service_with_csrf_and_audit(
    console: TestClient, tokens: dict[str, str], session_factory: Any,
) -> None:
    csrf = sign_in(console, tokens["operator"])
    no_csrf = console.post("/console/catalog/tiny/promote", data={"alias": "prod", "version": "v2", "reason": "r"})
    assert no_csrf.status_code == 403 and "csrf_failed" in no_csrf.text
    wrong_csrf = console.post("/console/catalog/tiny/promote",
                              data={"csrf_token": "0" * 64, "alias": "prod", "version": "v2", "reason": "r"})
    assert wrong_csrf.status_code == 403
    with session_factory() as session:
        assert catalog_aliases.get_alias_or_raise(session, model="tiny", name="prod").revision == 1

    done = console.post("/console/catalog/tiny/promote",
                        data={"csrf_token": csrf, "alias": "prod", "version": "v2", "reason": "v2 is better"})
    assert done.status_code == 200, done.text
    row = done.text.split('data-testid="alias-tiny-prod"')[1].split("</tr>")[0]
    assert "v2" in row and "v1 → v2" in row and "v2 is better" in row
    with session_factory() as session:
        events = event_service.list_events(session, EventFilter(kind="alias.promote"), limit=10)
        assert [(e.actor, e.routing_tier) for e in events][-1] == ("token:test-operator#2", "l7")
    assert audit_rows(session_factory)[-1] == ("token:test-operator#2", "console.catalog_promote", "succeeded", 303)
    assert [r[3] for r in audit_rows(session_factory)[-3:-1]] == [403, 403]


@pytest.mark.usefixtures("catalog_two_versions")
def test_a_refused_promote_shows_the_services_error_and_changes_nothing(
    console: TestClient, tokens: dict[str, str], session_factory: Any, clock: ManualClock, tmp_path: Path,
) -> None:
    register(session_factory, clock, tmp_path / "other", "v3", eos=99)  # another tokenizer: another fingerprint
    csrf = sign_in(console, tokens["operator"])
    refused = console.post("/console/catalog/tiny/promote",
                           data={"csrf_token": csrf, "alias": "prod", "version": "v3", "reason": "try"})
    assert refused.status_code == 409 and "fingerprint_mismatch" in refused.text
    empty_reason = console.post("/console/catalog/tiny/aliases/prod/rollback", data={"csrf_token": csrf,
                                                                                       "reason": " "})
    assert empty_reason.status_code == 422 and "invalid_request" in empty_reason.text
    with session_factory() as session:
        assert catalog_aliases.get_alias_or_raise(session, model="tiny", name="prod").revision == 1


@pytest.mark.usefixtures("catalog_two_versions")
def test_catalog_shows_each_versions_last_verify_known_issues_and_fingerprint_parts(
    console: TestClient, tokens: dict[str, str], session_factory: Any, clock: ManualClock, tmp_path: Path,
) -> None:
    from weight_catalog import known_issues, verify
    from weight_catalog.models import Severity

    root = tmp_path / "artifacts"
    (root / "v2" / "model.safetensors").write_bytes(b"bitrot" * 64)  # v2's shard no longer matches its checksum
    with session_scope(session_factory) as session:
        for version in ("v1", "v2"):
            report = verify.verify(session, model="tiny", version=version, store=open_store(str(root / version)),
                                   workers=1)
            verify.record_verify(session, report=report, actor="test", clock=clock)
        known_issues.add_issue(session, model="tiny", version="v2", severity=Severity.CRITICAL,
                               title="NaNs after 2k tokens", description="", actor="test", clock=clock)
        fixed = known_issues.add_issue(session, model="tiny", version="v1", severity=Severity.LOW,
                                       title="slow first token", description="", actor="test", clock=clock)
        known_issues.resolve_issue(session, issue_id=fixed.id, resolution="warm pool", actor="test", clock=clock)
        parts = dict(catalog_service.get_version_or_raise(session, model="tiny", version="v1").fingerprint_parts)
    sign_in(console, tokens["viewer"])
    page = console.get("/console/catalog").text
    v1 = page.split('data-testid="version-tiny-v1"')[1].split("</tr>")[0]
    v2 = page.split('data-testid="version-tiny-v2"')[1].split("</tr>")[0]
    assert "healthy" in v1 and "unhealthy" not in v1 and "never verified" not in v1
    assert "unhealthy" in v2
    assert "critical" in v2 and "NaNs after 2k tokens" in v2 and "open since" in v2
    assert "slow first token" in v1 and "resolved" in v1 and "warm pool" in v1 and "NaNs" not in v1
    assert parts and all(f"<dt>{part}</dt>" in v1 for part in parts)  # every fingerprint part, by name


# --- cutovers ------------------------------------------------------------------------------------------------------

@pytest.mark.usefixtures("topology_eu")
def test_plan_confirm_execute_and_roll_back_an_l7_cutover(
    console: TestClient, tokens: dict[str, str], session_factory: Any,
) -> None:
    csrf = sign_in(console, tokens["operator"])
    planned = console.post("/console/cutovers", data={
        "csrf_token": csrf, "scope_kind": "zone", "region": "eu", "name": "eu-a", "tier": "l7",
        "target_state": "out", "reason": "eu-a packet loss"}, follow_redirects=False)
    assert planned.status_code == 303, planned.text
    detail_url = planned.headers["location"]
    cutover_id = int(detail_url.rsplit("/", 1)[1])
    detail = console.get(detail_url).text
    assert 'data-testid="cutover-state">planned' in detail and "no rule refuses it now" in detail

    confirm = console.get(f"/console/cutovers/{cutover_id}/execute").text
    assert "Expected effect" in confirm and "draining" in confirm and "assertion.serving_region" in confirm
    assert "Break-glass" not in confirm  # an operator is not offered what needs admin
    key = confirm.split('name="idempotency_key" value="')[1].split('"')[0]
    bg = console.post(f"/console/cutovers/{cutover_id}/execute",
                      data={"csrf_token": csrf, "idempotency_key": key, "break_glass": "on",
                            "break_glass_reason": "why not"})
    assert bg.status_code == 403 and "break_glass_needs_admin" in bg.text
    done = console.post(f"/console/cutovers/{cutover_id}/execute", data={"csrf_token": csrf,
                                                                         "idempotency_key": key})
    assert done.status_code == 200 and 'data-testid="cutover-state">completed' in done.text
    assert "snapshot" in done.text  # the steps' verification evidence is shown

    rollback_page = console.get(f"/console/cutovers/{cutover_id}/rollback").text
    assert "never blocked by safety rules" in rollback_page
    back = console.post(f"/console/cutovers/{cutover_id}/rollback", data={"csrf_token": csrf, "reason": "fine"})
    assert back.status_code == 200 and 'data-testid="cutover-state">rolled_back' in back.text

    with session_factory() as session:
        kinds = [(e.kind, e.actor) for e in event_service.list_events(
            session, EventFilter(scope_prefix="region:eu/zone:eu-a"), limit=100) if e.kind.startswith("cutover.")]
    assert ("cutover.step", "token:test-operator#2") in kinds
    assert ("cutover.rollback_step", "token:test-operator#2") in kinds
    actions = [(a, s) for _, a, _, s in audit_rows(session_factory)]
    assert ("console.cutover_execute", 303) in actions and ("console.cutover_rollback", 303) in actions

    listing = console.get("/console/cutovers").text
    assert f'data-testid="cutover-{cutover_id}"' in listing and "rolled_back" in listing


@pytest.mark.usefixtures("topology_eu")
def test_viewer_sees_cutovers_without_actions_and_cannot_plan(console: TestClient, tokens: dict[str, str],
                                                                 session_factory: Any) -> None:
    csrf = sign_in(console, tokens["viewer"])
    page = console.get("/console/cutovers").text
    assert 'data-testid="plan-form"' not in page and "Review shift" not in page
    refused = console.post("/console/cutovers", data={"csrf_token": csrf, "scope_kind": "region", "region": "eu",
                                                      "tier": "l7", "reason": "x"})
    assert refused.status_code == 403
    with session_factory() as session:
        from cutover import service as cutover_service

        assert list(cutover_service.list_cutovers(session)) == []


@pytest.mark.usefixtures("topology_eu")
def test_zonal_shift_start_shows_its_effect_then_cancel_rolls_it_back(
    console: TestClient, tokens: dict[str, str], session_factory: Any,
) -> None:
    csrf = sign_in(console, tokens["operator"])
    confirm = console.get("/console/zonal-shifts/new",
                          params={"region": "eu", "zone": "eu-b", "expires_in_h": "2", "reason": "flaky"})
    assert confirm.status_code == 200
    assert "c-eu-b" in confirm.text and "100 → 0" in confirm.text and "every model keeps a serving region" in confirm.text
    too_long = console.post("/console/zonal-shifts", data={"csrf_token": csrf, "region": "eu", "zone": "eu-b",
                                                           "expires_in_h": "100", "reason": "flaky"})
    assert too_long.status_code == 422 and "invalid_expiry" in too_long.text
    started = console.post("/console/zonal-shifts", data={"csrf_token": csrf, "region": "eu", "zone": "eu-b",
                                                          "expires_in_h": "2", "reason": "flaky"})
    assert started.status_code == 200 and "completed" in started.text and "zonal shift" in started.text
    from cutover import zonal_shift

    with session_factory() as session:
        (shift,) = zonal_shift.list_shifts(session, active_only=True)
    assert "Cancel shift" in console.get("/console/cutovers").text
    cancelled = console.post(f"/console/zonal-shifts/{shift.id}/cancel", data={"csrf_token": csrf,
                                                                               "reason": "fixed"})
    assert cancelled.status_code == 200 and "rolled_back" in cancelled.text
    with session_factory() as session:
        assert list(zonal_shift.list_shifts(session, active_only=True)) == []


# --- events --------------------------------------------------------------------------------------------------------

@pytest.mark.usefixtures("topology_eu")
def test_event_timeline_filters_and_links_to_the_cutover(console: TestClient, tokens: dict[str, str]) -> None:
    csrf = sign_in(console, tokens["operator"])
    planned = console.post("/console/cutovers", data={
        "csrf_token": csrf, "scope_kind": "region", "region": "us", "tier": "l7", "target_state": "out",
        "reason": "us drill"}, follow_redirects=False)
    cutover_id = int(planned.headers["location"].rsplit("/", 1)[1])
    everything = console.get("/console/events").text
    assert "cutover.plan" in everything and f'href="/console/cutovers/{cutover_id}"' in everything
    by_actor = console.get("/console/events", params={"actor": "test"}).text
    assert "cutover.plan" not in by_actor and "cluster.create" in by_actor
    by_scope = console.get("/console/events", params={"scope": "region:us"}).text
    assert "cutover.plan" in by_scope and "c-eu-a" not in by_scope
    partial = console.get("/console/events", params={"routing_tier": "l7"}, headers={"HX-Request": "true"})
    assert partial.text.lstrip().startswith('<div id="timeline-region">')
    assert "cutover.plan" not in partial.text  # a plan has no routing tier
    assert "stream?" in partial.text and "routing_tier=l7" in partial.text


def test_the_event_stream_needs_a_session(console: TestClient) -> None:
    assert console.get("/console/events/stream").status_code == 401


def test_static_htmx_is_vendored_with_its_licence(console: TestClient) -> None:
    js = console.get("/console/static/htmx.min.js")
    assert js.status_code == 200 and "htmx" in js.text[:2000]
    assert "Zero-Clause BSD" in console.get("/console/static/htmx.LICENSE.txt").text
    assert console.get("/console/static/../session.py").status_code == 404


def test_csrf_token_is_bound_to_the_session(console: TestClient, tokens: dict[str, str]) -> None:
    first = sign_in(console, tokens["operator"])
    second = sign_in(console, tokens["operator"])
    assert first != second
    assert csrf_of(console.get("/console/cutovers").text) == second


@pytest.mark.usefixtures("topology_eu")
def test_a_safety_rule_refuses_an_operator_and_an_admin_breaks_glass(
    console: TestClient, tokens: dict[str, str], session_factory: Any,
) -> None:
    def plan_region(csrf: str, region: str) -> int:
        planned = console.post("/console/cutovers", data={
            "csrf_token": csrf, "scope_kind": "region", "region": region, "tier": "l7", "target_state": "out",
            "reason": f"{region} out"}, follow_redirects=False)
        assert planned.status_code == 303, planned.text
        return int(planned.headers["location"].rsplit("/", 1)[1])

    def execute(csrf: str, cutover_id: int, **extra: str) -> Any:
        confirm = console.get(f"/console/cutovers/{cutover_id}/execute").text
        key = confirm.split('name="idempotency_key" value="')[1].split('"')[0]
        return console.post(f"/console/cutovers/{cutover_id}/execute",
                            data={"csrf_token": csrf, "idempotency_key": key, **extra})

    csrf = sign_in(console, tokens["operator"])
    us = plan_region(csrf, "us")
    assert 'data-testid="cutover-state">completed' in execute(csrf, us).text
    eu = plan_region(csrf, "eu")
    confirm = console.get(f"/console/cutovers/{eu}/execute").text
    assert "assertion.serving_region" in confirm and "leaves no region serving m" in confirm
    refused = execute(csrf, eu)
    assert refused.status_code == 409 and "safety_rule_violation" in refused.text

    admin_csrf = sign_in(console, tokens["admin"])
    assert "Break-glass (admin)" in console.get(f"/console/cutovers/{eu}/execute").text
    no_reason = execute(admin_csrf, eu, break_glass="on")
    assert no_reason.status_code == 422 and "break_glass_needs_reason" in no_reason.text
    done = execute(admin_csrf, eu, break_glass="on", break_glass_reason="both regions are being rebuilt")
    assert 'data-testid="cutover-state">completed' in done.text and "both regions are being rebuilt" in done.text
    with session_factory() as session:
        kinds = [e.kind for e in event_service.list_events(session, EventFilter(kind="cutover.break_glass"),
                                                           limit=10)]
    assert kinds == ["cutover.break_glass"]
