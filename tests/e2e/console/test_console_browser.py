"""The operator console in a real browser: headless Debian Chromium driven by Playwright.

A real fleet, every part its own process: `lifeline controlplane serve`
(SQLite) with two registered versions of the tiny model (seed 0 and seed 1,
built by `lifeline.processes.built_model`); two `lifeline gateway serve`
replicas in region eu (routing.source snapshot, a `gateway` token), which
poll the snapshot and report the version they applied; two
`lifeline engine serve` processes (engine-1 in eu-a on seed 0, engine-2 in
eu-b on seed 1) that hold their leases through a gateway in the real Redis
(127.0.0.1:6379, keys under a random prefix, removed after), which the
control plane reads for the fleet. Killing an engine is SIGKILL to its
process; its lease lapses by itself (TTL 2 s). A cutover's l7 step
verifies against the gateways' own reports.

Playwright's own browser download cannot run here; it drives
`/usr/bin/chromium` (Debian's `chromium`, `make system-deps`) through
`executable_path`. Every page is screenshotted into
`$LIFELINE_TEST_ARTIFACTS/console/` (default `.lifeline/test-artifacts/`,
git-ignored), emptied when the module starts.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from common import oneshot_http
from lifeline.processes import (
    LEASE_TOKEN,
    ControlPlaneProcess,
    EngineProcess,
    GatewayProcess,
    built_model,
    free_port,
)

pytestmark = pytest.mark.long  # scheduled first in its tier (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = Path(os.environ.get("LIFELINE_TEST_ARTIFACTS", ROOT / ".lifeline" / "test-artifacts")) / "console"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REDIS_URL = "redis://127.0.0.1:6379/0"
TIMEOUT_MS = 20_000
SEED0, SEED1 = "tiny-seed0", "tiny-seed1"  # the built models' directory names: the catalog's version names
GATEWAYS = (("gw-eu-1", "eu-a"), ("gw-eu-2", "eu-b"))
# engine-3 is the one a test kills; engine-2 serves seed 1, which a promote moves prod to.
ENGINES = (("engine-1", "eu-a", SEED0), ("engine-2", "eu-b", SEED1), ("engine-3", "eu-b", SEED0))


class Console:
    def __init__(self, cp: ControlPlaneProcess, tokens: dict[str, str], prefix: str,
                 gateways: list[GatewayProcess], engines: dict[str, EngineProcess]) -> None:
        self.cp, self.tokens, self.prefix = cp, tokens, prefix
        self.gateways, self.engines = gateways, engines

    @property
    def url(self) -> str:
        return self.cp.url

    def api(self, role: str) -> httpx.Client:
        return httpx.Client(base_url=self.cp.url, headers={"Authorization": f"Bearer {self.tokens[role]}"},
                            timeout=30.0)


def gateway_config(cp: ControlPlaneProcess, token: str, prefix: str, workdir: Path, replica: str,
                   zone: str) -> dict[str, Any]:
    """A replica of region eu that routes by the control plane's snapshot and shares the region's Redis registry."""
    return {
        "region": "eu", "zone": zone,
        "registry": {"kind": "redis", "url": REDIS_URL, "key_prefix": prefix, "token": LEASE_TOKEN, "ttl": 2.0,
                     "refresh_interval": 0.1},
        "recovery": {"stall_timeout": 1.5, "first_token_timeout": 20.0, "connect_timeout": 1.0},
        "routing": {"source": "snapshot", "controlplane_url": cp.url, "token": token, "poll_interval": 0.25,
                    "cache_path": str(workdir / replica / "snapshot.json"), "report_interval": 0.5,
                    "event_flush_interval": 0.2},
    }


@pytest.fixture(scope="module")
def artifacts() -> Iterator[Path]:
    shutil.rmtree(ARTIFACTS, ignore_errors=True)  # only this run's screenshots, so a missing one shows
    ARTIFACTS.mkdir(parents=True)
    yield ARTIFACTS
    print(f"\nconsole screenshots: {ARTIFACTS}")


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    workdir = tmp_path_factory.mktemp("console-fleet")
    prefix = f"console-e2e-{secrets.token_hex(4)}"
    models = {path.name: path for path in (built_model("tiny", 0), built_model("tiny", 1))}
    assert sorted(models) == [SEED0, SEED1]
    # The agent's reports go stale quickly here, so a test can watch a quiet agent's verdicts turn stale.
    cp = ControlPlaneProcess(workdir=workdir / "controlplane",
                             env={"LIFELINE_CONTROLPLANE_LEASE_REDIS_URL": REDIS_URL,
                                  "LIFELINE_CONTROLPLANE_LEASE_KEY_PREFIX": prefix,
                                  "LIFELINE_CONTROLPLANE_AGENT_REPORT_STALE_AFTER": "PT3S"})
    tokens = {role: cp.create_token(role, name=f"e2e-{role}")
              for role in ("viewer", "operator", "admin", "gateway", "agent")}
    for version, model_dir in sorted(models.items()):
        cp.cli("catalog", "register", "tiny", version, str(model_dir))
    cp.cli("catalog", "promote", "tiny", "prod", SEED0, "--reason", "first")
    # A gateway takes a lease only for a version its snapshot serves: canary puts seed 1 there for engine-2.
    cp.cli("catalog", "promote", "tiny", "canary", SEED1, "--reason", "first")
    cp.start()
    gateways: list[GatewayProcess] = []
    engines: dict[str, EngineProcess] = {}
    store = redis.Redis.from_url(REDIS_URL)
    try:
        cp.wait_ready()
        with httpx.Client(base_url=cp.url, headers={"Authorization": f"Bearer {tokens['operator']}"},
                          timeout=30.0) as api:
            for region, zones in (("eu", ("eu-a", "eu-b")), ("us", ("us-a",))):
                assert api.post("/api/v1/regions", json={"name": region}).status_code == 201
                for zone in zones:
                    assert api.post(f"/api/v1/regions/{region}/zones", json={"name": zone}).status_code == 201
                    created = api.post("/api/v1/clusters", json={"name": f"c-{zone}", "region": region,
                                                                 "zone": zone, "model": "tiny", "weight": 100})
                    assert created.status_code == 201, created.text
        for replica, zone in GATEWAYS:
            gateway = GatewayProcess(gateway_config(cp, tokens["gateway"], prefix, workdir, replica, zone),
                                     free_port(), workdir, replica_id=replica)
            gateways.append(gateway)
            gateway.start()
        for gateway in gateways:
            gateway.wait_live()
        for instance, zone, version in ENGINES:
            engines[instance] = EngineProcess(
                models[version], free_port(), instance, workdir / "state" / instance, workdir / f"{instance}.log",
                extra_args=[*gateways[0].registry_args(), "--region", "eu", "--zone", zone])
            engines[instance].start()
        for engine in engines.values():
            engine.wait_ready()
        for gateway in gateways:
            gateway.wait_routable("tiny", 1)  # prod (seed 0) has engine-1 behind it at every replica
        yield Console(cp, tokens, prefix, gateways, engines)
    finally:
        for engine in engines.values():
            engine.kill()
        for gateway in gateways:
            gateway.kill()
        cp.stop()
        for found in store.scan_iter(f"{prefix}:*"):
            store.delete(found)
        store.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # Playwright gives each launch a new, empty profile directory of its own.
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page_for(browser: Any, console: Console) -> Iterator[Callable[[], Any]]:
    contexts: list[Any] = []

    def new_page() -> Any:
        context = browser.new_context(base_url=console.url, viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(TIMEOUT_MS)
        contexts.append(context)
        return context.new_page()

    yield new_page
    for context in contexts:
        context.close()


def sign_in(page: Any, token: str) -> None:
    page.goto("/console/sign-in")
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url("**/console/fleet")


def shoot(page: Any, artifacts: Path, name: str) -> None:
    page.screenshot(path=str(artifacts / f"{name}.png"), full_page=True)


def until(check: Callable[[], bool], what: str, attempts: int = 100) -> None:
    import time

    for _ in range(attempts):
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"never happened: {what}")


def agent_reports(console: Console, instances: list[dict[str, Any]]) -> None:
    """One report of eu's agent, as `warm_pool` sends it: PUT /api/v1/agents/eu with an `agent` token."""
    now = datetime.now(UTC).isoformat()
    with httpx.Client(base_url=console.url, headers={"Authorization": f"Bearer {console.tokens['agent']}"},
                      timeout=10.0) as client:
        response = client.put("/api/v1/agents/eu", json={"region": "eu", "agent_id": "agent-eu-e2e", "sent_at": now,
                                                         "snapshot_version": 1, "instances": instances})
    assert response.status_code == 200, response.text


def test_operator_sees_the_fleet_and_an_engine_leaving_it_live(page_for: Callable[[], Any], console: Console,
                                                              artifacts: Path) -> None:
    page = page_for()
    sign_in(page, console.tokens["operator"])
    leases = console.gateways[0].leases()  # instance → generation, as the gateway's registry holds them
    for instance, zone, version in ENGINES:
        row = page.locator(f'[data-testid="region-eu"] [data-testid="instance-{instance}"]').inner_text()
        engine = console.engines[instance]
        assert version in row and "live" in row and engine.url in row, row
        assert f"\t{leases[instance]}\t" in f"\t{row}\t", (instance, leases, row)  # the generation cell
    # No reload from here on: the page's body refreshes itself.
    page.wait_for_selector("#fleet-status:text('live')")
    for replica, _ in GATEWAYS:
        page.wait_for_selector(f'[data-testid="gateway-{replica}"]')
    assert "current" in page.locator('[data-testid="gateway-gw-eu-1"]').inner_text()

    # The region's agent reports a probe verdict and a canary for engine-1, and a warm pool instance.
    agent_reports(console, [
        {"instance_id": "engine-1", "zone": "eu-a", "version": SEED0, "url": console.engines["engine-1"].url,
         "origin": "registry", "verdict": "wrong_output", "verdict_reason": "canary tokens differ at position 3",
         "verdict_since": datetime.now(UTC).isoformat(), "canary_verdict": "wrong_output",
         "canary_at": datetime.now(UTC).isoformat(), "canaries": 2},
        {"instance_id": "pool-eu-b-1", "zone": "eu-b", "version": SEED0, "url": "http://127.0.0.1:1/pool",
         "origin": "pool", "pool_state": "warm"},
    ])
    verdict = page.locator('[data-testid="instance-engine-1"] [data-testid="verdict"]')
    until(lambda: "wrong_output" in verdict.inner_text(), "the agent's verdict appears without a reload")
    assert "stale" not in verdict.inner_text() and "canary tokens differ" in verdict.inner_text()
    assert "warm" in page.locator('[data-testid="agent-instance-pool-eu-b-1"]').inner_text()
    shoot(page, artifacts, "fleet")
    # The agent goes quiet (stale after 3 s here): its verdict stays on screen, marked stale, never as current.
    until(lambda: "stale" in verdict.inner_text(), "the quiet agent's verdict is marked stale")
    assert "wrong_output" in verdict.inner_text() and "stale" in page.get_by_test_id("agent-eu").inner_text()
    shoot(page, artifacts, "fleet-agent-stale")

    # SIGKILL: the engine cannot release anything; its lease lapses by itself within the TTL (2 s).
    console.engines["engine-3"].kill(signal.SIGKILL)
    page.wait_for_selector('[data-testid="instance-engine-3"]', state="detached")  # it leaves the open page
    assert page.locator('[data-testid="instance-engine-1"]').count() == 1
    assert page.locator('[data-testid="instance-engine-2"]').count() == 1
    shoot(page, artifacts, "fleet-engine-killed")


def completion(gateway: GatewayProcess) -> tuple[int, ...] | None:
    """A short greedy completion of alias `tiny` (prod) through one gateway: its token ids, or None if refused."""
    body = {"model": "tiny", "prompt": "The console promoted the alias, so the gateway", "max_tokens": 4,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    try:
        response = oneshot_http.post(f"{gateway.url}/v1/completions", json=body, timeout=30)
    except httpx.TransportError:
        return None
    return tuple(response.json()["choices"][0]["token_ids"]) if response.status_code == 200 else None


def test_promote_an_alias_and_see_every_gateway_apply_it(page_for: Callable[[], Any], console: Console,
                                                        artifacts: Path) -> None:
    answered_before = {g.replica_id: completion(g) for g in console.gateways}  # seed 0's tokens
    assert None not in answered_before.values() and len(set(answered_before.values())) == 1
    page = page_for()
    sign_in(page, console.tokens["operator"])
    with console.api("viewer") as api:
        before = api.get("/api/v1/snapshot").json()["version"]
    page.get_by_role("link", name="Catalog", exact=True).click()
    form = page.locator('[data-testid="promote-tiny"]')
    form.locator("select[name=version]").select_option(SEED1)
    form.locator("input[name=reason]").fill("seed 1 passed canary")
    form.get_by_role("button", name="Promote").click()
    page.wait_for_load_state()
    row = page.locator('[data-testid="alias-tiny-prod"]')
    assert row.locator('[data-testid="alias-version"]').inner_text() == SEED1
    row.locator("summary").click()
    assert f"{SEED0} → {SEED1}" in row.inner_text() and "seed 1 passed canary" in row.inner_text()
    shoot(page, artifacts, "catalog")

    page.get_by_role("link", name="Fleet", exact=True).click()

    def applied() -> bool:  # no reload: the fleet page follows the gateways' reports by itself
        texts = [page.locator(f'[data-testid="gateway-{replica}"]').inner_text() for replica, _ in GATEWAYS]
        # a promote advances the snapshot version by exactly one
        return all(f"v{before + 1}" in t and "current" in t for t in texts)

    until(applied, "every gateway applies the promoted snapshot")
    shoot(page, artifacts, "fleet-promoted")
    # What the page says is what the gateways do: each now answers prod from seed 1 (engine-2), not seed 0.
    for gateway in console.gateways:
        until(lambda gateway=gateway: completion(gateway) not in (None, answered_before[gateway.replica_id]),
              f"{gateway.replica_id} answers prod from the promoted version")


def test_plan_execute_and_roll_back_an_l7_cutover_with_a_live_timeline(
    page_for: Callable[[], Any], console: Console, artifacts: Path,
) -> None:
    timeline = page_for()
    sign_in(timeline, console.tokens["viewer"])
    timeline.goto("/console/events?routing_tier=l7")
    timeline.wait_for_selector("#live-status:text('live')")
    rows_before = timeline.locator("#timeline-rows tr").count()

    page = page_for()
    sign_in(page, console.tokens["operator"])
    page.get_by_role("link", name="Cutovers", exact=True).click()
    plan = page.locator('[data-testid="plan-form"]')
    plan.locator("#pl-kind").select_option("zone")
    plan.locator("#pl-region").select_option("eu")
    plan.locator("#pl-name").fill("eu-a")
    plan.locator("#pl-tier").select_option("l7")
    plan.locator("#pl-reason").fill("eu-a packet loss")
    plan.get_by_role("button", name="Plan (changes nothing)").click()
    page.wait_for_url("**/console/cutovers/*")
    assert page.locator('[data-testid="cutover-state"]').inner_text() == "planned"
    page.get_by_test_id("review-execute").click()
    assert "Expected effect" in page.content()
    assert page.get_by_test_id("violations-none").count() == 1
    shoot(page, artifacts, "cutover-confirm")
    page.get_by_role("button", name="Execute cutover").click()
    page.wait_for_selector('[data-testid="cutover-state"]:text("completed")')
    assert "succeeded" in page.get_by_test_id("steps").inner_text()
    shoot(page, artifacts, "cutover-completed")

    # The timeline, opened before, shows the step without a reload.
    timeline.wait_for_selector("#timeline-rows tr.fresh:has-text('cutover.step')")
    assert timeline.locator("#timeline-rows tr").count() > rows_before
    cutover_url = page.url  # the operator's tab is on the cutover that wrote the step
    link = timeline.locator("#timeline-rows tr.fresh:has-text('cutover.step')").first.get_by_role("link")
    assert cutover_url.endswith(link.get_attribute("href"))
    shoot(timeline, artifacts, "events")

    page.get_by_test_id("review-rollback").click()
    page.fill("#rb-reason", "eu-a recovered")
    page.get_by_role("button", name="Roll back cutover").click()
    page.wait_for_selector('[data-testid="cutover-state"]:text("rolled_back")')
    timeline.wait_for_selector("#timeline-rows tr.fresh:has-text('cutover.rollback_step')")
    # One click from the rollback's event to the cutover that wrote it, showing it rolled back.
    timeline.locator("#timeline-rows tr.fresh:has-text('cutover.rollback_step')").first.get_by_role("link").click()
    timeline.wait_for_url(cutover_url)
    assert timeline.get_by_test_id("cutover-state").inner_text() == "rolled_back"
    page.get_by_role("link", name="Cutovers", exact=True).click()
    shoot(page, artifacts, "cutovers")


def test_start_a_zonal_shift_behind_its_confirmation_and_cancel_it(page_for: Callable[[], Any], console: Console,
                                                                  artifacts: Path) -> None:
    # us-a: a zone no other test cuts over (the minimum wait between a scope's cutovers is 5 minutes).
    page = page_for()
    sign_in(page, console.tokens["operator"])
    page.get_by_role("link", name="Cutovers", exact=True).click()
    page.locator("#zs-region").select_option("us")
    page.fill("#zs-zone", "us-a")
    page.fill("#zs-exp", "1")
    page.fill("#zs-reason", "us-a packet loss")
    page.get_by_role("button", name="Review shift…").click()
    page.wait_for_url("**/console/zonal-shifts/new?*")
    rules = page.get_by_test_id("shift-rules").inner_text()
    assert "gating.stop_switch: off" in rules and "every model keeps a serving region" in rules
    assert "c-us-a" in page.content() and "100 → 0" in page.content()  # the expected effect, before acting
    shoot(page, artifacts, "zonal-shift-confirm")
    page.get_by_role("button", name="Start zonal shift of us/us-a").click()
    page.wait_for_selector('[data-testid="cutover-state"]:text("completed")')
    assert "us-a packet loss" in page.get_by_test_id("cutover-summary").inner_text()
    page.get_by_role("link", name="Cancel zonal shift").click()
    page.wait_for_url("**/console/zonal-shifts/*/cancel")
    assert "rolled back now" in page.content()
    page.fill("#cs-reason", "us-a recovered")
    page.get_by_role("button", name="Cancel zonal shift").click()
    page.wait_for_selector('[data-testid="cutover-state"]:text("rolled_back")')
    with console.api("viewer") as api:
        shifts = [s for s in api.get("/api/v1/zonal-shifts").json() if s["zone"] == "us-a"]
    assert [(s["reason"], s["ended_at"] is not None) for s in shifts] == [("us-a packet loss", True)]


ZONE_DRILL = {"name": "lose-eu-b", "model": "tiny", "scope": "zone", "fault": "zone_loss",
              "blast_radius": {"region": "eu", "zones": ["eu-b"]}, "description": "e2e: defined in the console"}


def test_define_a_drill_request_a_run_and_abort_it_from_the_console(page_for: Callable[[], Any], console: Console,
                                                                   artifacts: Path) -> None:
    page = page_for()
    sign_in(page, console.tokens["operator"])
    page.get_by_role("link", name="Drills & SLOs", exact=True).click()
    page.get_by_test_id("define-drill").locator("summary").click()
    page.fill("#dr-spec", json.dumps(ZONE_DRILL, indent=1))
    page.get_by_role("button", name="Define drill").click()
    page.wait_for_selector('[data-testid="drill-lose-eu-b"]')
    assert "zone_loss" in page.get_by_test_id("drill-lose-eu-b").inner_text()
    shoot(page, artifacts, "drills")

    page.get_by_test_id("request-lose-eu-b").click()
    page.wait_for_url("**/console/drills/lose-eu-b/request*")
    assert "awaiting approval" in page.get_by_test_id("drill-effect").inner_text()
    assert "eu-b" in page.get_by_test_id("drill-spec").inner_text()
    shoot(page, artifacts, "drill-request-confirm")
    page.get_by_role("button", name="Request a run of lose-eu-b v1").click()  # the drill's v1, not a model's
    page.wait_for_url("**/console/drills/runs/*")
    assert page.get_by_test_id("drill-state").inner_text() == "awaiting_approval"
    run_id = int(page.url.rsplit("/", 1)[1])

    page.get_by_test_id("review-abort").click()
    page.wait_for_url(f"**/console/drills/runs/{run_id}/abort")
    assert "never injects its fault" in page.get_by_test_id("abort-effect").inner_text()
    page.fill("#ab-reason", "e2e: changed my mind")
    page.get_by_role("button", name=f"Abort drill run #{run_id}").click()
    page.wait_for_selector('[data-testid="drill-state"]:text("aborted")')
    assert "e2e: changed my mind" in page.content() and page.get_by_test_id("review-abort").count() == 0
    shoot(page, artifacts, "drill-aborted")
    with console.api("viewer") as api:
        run = api.get(f"/api/v1/drills/runs/{run_id}").json()
    assert (run["state"], run["abort_reason"], run["requested_by"]) == (
        "aborted", "e2e: changed my mind", "token:e2e-operator#2")


def test_a_viewer_finds_no_way_to_act(page_for: Callable[[], Any], console: Console, artifacts: Path) -> None:
    page = page_for()
    sign_in(page, console.tokens["viewer"])
    for path in ("/console/fleet", "/console/catalog", "/console/cutovers", "/console/events", "/console/drills",
                 "/console/slo/tiny", "/console/drills/lose-eu-b/request", "/console/drills/runs/1",
                 "/console/drills/runs/1/abort",
                 "/console/cutovers/1", "/console/cutovers/1/execute", "/console/cutovers/1/rollback"):
        page.goto(path)
        actions = page.locator("form[method=post]:not([action='/console/sign-out'])")
        assert actions.count() == 0, f"{path} offers a viewer an action"
        buttons = [b.strip() for b in page.locator("button").all_inner_texts()]
        assert set(buttons) <= {"Sign out", "Filter"}, (path, buttons)
        links = page.locator("a").all_inner_texts()
        assert not any(word in " ".join(links) for word in ("Review", "Cancel shift", "Request a run")), (path, links)
    shoot(page, artifacts, "viewer-cutover")
    # And the server refuses the action anyway, even with the viewer's own valid CSRF token.
    csrf = page.locator("form[action='/console/sign-out'] input[name=csrf_token]").get_attribute("value")
    refused = page.request.post("/console/catalog/tiny/promote",
                                form={"csrf_token": csrf, "alias": "prod", "version": SEED0, "reason": "x"})
    assert refused.status == 403
    # Sign out: back at the sign-in page, and the old session opens nothing.
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/console/sign-in")
    assert "lifeline_console" not in {c["name"] for c in page.context.cookies()}
    page.goto("/console/catalog")
    page.wait_for_url("**/console/sign-in?next=*")
    assert page.request.post("/console/catalog/tiny/promote", form={"csrf_token": csrf, "alias": "prod",
                                                                     "version": SEED0, "reason": "x"}).status == 401


def test_keyboard_only_sign_in_plan_and_execute(page_for: Callable[[], Any], console: Console,
                                                artifacts: Path) -> None:
    page = page_for()
    keyboard_sign_in(page, console.tokens["operator"])
    page.keyboard.press("Tab")  # on every page the skip link comes first
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    tab_to(page, "document.activeElement.textContent === 'Cutovers'", "the Cutovers link")
    page.keyboard.press("Enter")
    page.wait_for_url("**/console/cutovers")
    tab_to(page, "document.activeElement.id === 'pl-kind'", "the plan form")
    page.keyboard.press("Tab")   # region (first: eu)
    page.keyboard.press("Tab")   # zone / instance
    page.keyboard.type("eu-b")
    tab_to(page, "document.activeElement.id === 'pl-reason'", "the reason")
    page.keyboard.type("keyboard drill")
    page.keyboard.press("Enter")
    page.wait_for_url("**/console/cutovers/*")
    tab_to(page, "document.activeElement.dataset.testid === 'review-execute'", "Review and execute")
    page.keyboard.press("Enter")
    page.wait_for_url("**/execute")
    tab_to(page, "document.activeElement.textContent.startsWith('Execute cutover')", "the Execute button")
    page.keyboard.press("Enter")
    page.wait_for_selector('[data-testid="cutover-state"]:text("completed")')
    shoot(page, artifacts, "keyboard-completed")
    tab_to(page, "document.activeElement.dataset.testid === 'review-rollback'", "Review and roll back")
    page.keyboard.press("Enter")
    page.wait_for_url("**/rollback")
    tab_to(page, "document.activeElement.id === 'rb-reason'", "the rollback reason")
    page.keyboard.type("done")
    page.keyboard.press("Enter")
    page.wait_for_selector('[data-testid="cutover-state"]:text("rolled_back")')


def test_a_cross_site_form_cannot_act_for_a_signed_in_operator(page_for: Callable[[], Any], console: Console,
                                                                artifacts: Path) -> None:
    """Another site (localhost is not 127.0.0.1's site) auto-posts a plan form at the console in the operator's
    browser: the SameSite=Strict cookie is not sent, so the console sees no session, and nothing is planned."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    fields = {"csrf_token": "0" * 64, "scope_kind": "region", "region": "us", "tier": "l7",
              "target_state": "out", "reason": "cross-site"}
    inputs = "".join(f'<input name="{k}" value="{v}">' for k, v in fields.items())
    evil = (f'<form id="f" method="post" action="{console.url}/console/cutovers">{inputs}</form>'
            '<script>document.getElementById("f").submit()</script>').encode()

    class Evil(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(evil)))
            self.end_headers()
            self.wfile.write(evil)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with console.api("viewer") as api:
        before = len(api.get("/api/v1/cutovers").json())
    try:
        page = page_for()
        sign_in(page, console.tokens["operator"])
        page.goto(f"http://localhost:{server.server_address[1]}/")
        page.wait_for_url(f"{console.url}/console/cutovers")
        assert page.get_by_test_id("error-type").inner_text() == "unauthenticated"
        shoot(page, artifacts, "cross-site-refused")
    finally:
        server.shutdown()
        server.server_close()
    with console.api("viewer") as api:
        assert len(api.get("/api/v1/cutovers").json()) == before
    page.goto("/console/fleet")  # and the operator's own session is still there
    assert "operator" in page.get_by_test_id("who").inner_text()


def keyboard_sign_in(page: Any, token: str) -> None:
    page.goto("/console/sign-in")
    assert page.evaluate("document.activeElement.id") == "token"  # autofocus: type at once
    page.keyboard.type(token)
    page.keyboard.press("Enter")
    page.wait_for_url("**/console/fleet")


def tab_to(page: Any, check: str, what: str) -> None:
    for _ in range(120):
        page.keyboard.press("Tab")
        if page.evaluate(check):
            return
    raise AssertionError(f"Tab never reached {what}")


def test_keyboard_only_promote_and_roll_back_an_alias(page_for: Callable[[], Any], console: Console,
                                                      artifacts: Path) -> None:
    page = page_for()
    keyboard_sign_in(page, console.tokens["operator"])
    tab_to(page, "document.activeElement.textContent === 'Catalog'", "the Catalog link")
    page.keyboard.press("Enter")
    page.wait_for_url("**/console/catalog")
    version = page.locator('[data-testid="alias-tiny-prod"] [data-testid="alias-version"]')
    current = version.inner_text()
    target = SEED1 if current == SEED0 else SEED0
    tab_to(page, "document.activeElement.id === 'pv-tiny'", "the version to promote")
    page.keyboard.press("ArrowDown" if target == SEED1 else "ArrowUp")  # options are in version order
    assert page.evaluate("document.activeElement.value") == target
    tab_to(page, "document.activeElement.id === 'pr-tiny'", "the promote reason")
    page.keyboard.type("keyboard promote")
    page.keyboard.press("Enter")
    # A selector, not wait_for_function: the page's CSP (no 'unsafe-eval') refuses Playwright's string predicates.
    page.wait_for_selector(f'[data-testid="alias-tiny-prod"] [data-testid="alias-version"]:text-is("{target}")')
    shoot(page, artifacts, "keyboard-promoted")
    tab_to(page, "document.activeElement.id === 'rb-tiny-prod'", "the roll back reason")
    page.keyboard.type("keyboard rollback")
    page.keyboard.press("Enter")
    # A selector, not wait_for_function: the page's CSP (no 'unsafe-eval') refuses Playwright's string predicates.
    page.wait_for_selector(f'[data-testid="alias-tiny-prod"] [data-testid="alias-version"]:text-is("{current}")')


def test_abort_a_running_cutover_and_flip_the_stop_switch_from_the_console(
    page_for: Callable[[], Any], console: Console, artifacts: Path,
) -> None:
    """A real cutover held running by a SIGSTOPped gateway: its l7 step waits for every fresh gateway to apply."""
    generation = console.gateways[0].leases()["engine-1"]
    with console.api("operator") as api:  # engine-1's generation ejected at l7: a scope no other test cuts over
        planned = api.post("/api/v1/cutovers", json={
            "scope": {"kind": "instance", "region": "eu", "name": "engine-1"}, "tier": "l7",
            "generation": generation, "reason": "e2e: engine-1 stalls"})
        assert planned.status_code == 201, planned.text
    cutover_id = planned.json()["id"]
    stalled = console.gateways[0]
    executed: dict[str, Any] = {}

    def execute() -> None:
        with console.api("operator") as api:
            executed["answer"] = api.post(f"/api/v1/cutovers/{cutover_id}/execute", json={"idempotency_key": "e2e"},
                                          timeout=120.0)

    os.kill(stalled.process.pid, signal.SIGSTOP)  # its last report is fresh: the step waits for it to apply
    runner = threading.Thread(target=execute)
    try:
        runner.start()
        with console.api("viewer") as api:
            until(lambda: api.get(f"/api/v1/cutovers/{cutover_id}").json()["state"] == "executing",
                  "the cutover is executing")
        page = page_for()
        sign_in(page, console.tokens["operator"])
        page.goto(f"/console/cutovers/{cutover_id}")
        assert page.get_by_test_id("cutover-state").inner_text() == "executing"
        page.get_by_test_id("review-abort").click()
        page.wait_for_url("**/abort")
        assert "A runner holds this cutover" in page.get_by_test_id("abort-effect").inner_text()
        shoot(page, artifacts, "cutover-abort-confirm-running")
        page.fill("#ab-reason", "e2e: wrong instance")
        page.get_by_role("button", name=f"Abort cutover #{cutover_id}").click()
        page.wait_for_url(f"**/console/cutovers/{cutover_id}")
        assert "e2e: wrong instance" in page.get_by_test_id("abort-requested").inner_text()
        assert page.get_by_test_id("review-abort").count() == 0
    finally:
        os.kill(stalled.process.pid, signal.SIGCONT)
        runner.join(120)
    done = executed["answer"].json()  # the step verified once the gateway applied it; the runner then stopped
    assert (done["state"], done["failure"]) == ("rolled_back", "aborted by token:e2e-operator#2: e2e: wrong instance")
    page.reload()
    assert page.get_by_test_id("cutover-state").inner_text() == "rolled_back"
    with console.api("viewer") as api:
        assert api.get("/api/v1/snapshot").json()["ejections"] == []  # engine-1 is routable again
        requests = api.get("/api/v1/events", params={"kind": "cutover.abort_requested"}).json()
    assert [(e["actor"], e["after"]["cutover_id"]) for e in requests] == [("token:e2e-operator#2", cutover_id)]

    # The stop switch: an operator stops every new cutover behind its confirmation; releasing needs an admin.
    page.get_by_role("link", name="Cutovers", exact=True).click()
    page.get_by_test_id("review-gate").click()
    page.wait_for_url("**/console/cutover-gate")
    assert page.get_by_test_id("gate-running-none").count() == 1
    page.fill("#gate-reason", "e2e: change freeze")
    page.get_by_role("button", name="Stop every new cutover").click()
    page.wait_for_url("**/console/cutovers")
    assert "ON" in page.get_by_test_id("gate").inner_text() and "e2e: change freeze" in page.get_by_test_id(
        "gate").inner_text()
    page.get_by_test_id("review-gate").click()
    assert page.get_by_test_id("gate-needs-admin").count() == 1 and page.locator("#gate-reason").count() == 0
    shoot(page, artifacts, "gate-operator-cannot-release")
    admin = page_for()
    sign_in(admin, console.tokens["admin"])
    admin.goto("/console/cutover-gate")
    admin.fill("#gate-reason", "e2e: freeze over")
    admin.get_by_role("button", name="Release the stop switch").click()
    admin.wait_for_url("**/console/cutovers")
    assert "off." in admin.get_by_test_id("gate").inner_text()
    with console.api("viewer") as api:
        gates = api.get("/api/v1/events", params={"kind": "cutover.gate"}).json()
        assert api.get("/api/v1/cutover-gate").json()["stopped"] is False
    assert sorted((e["actor"], e["after"]["stopped"]) for e in gates) == [
        ("token:e2e-admin#3", False), ("token:e2e-operator#2", True)]


# Every page of the console, by the name its screenshot gets; `{cutover}` and `{run}` are filled in below.
PAGES = {
    "fleet": "/console/fleet", "catalog": "/console/catalog", "cutovers": "/console/cutovers",
    "cutover": "/console/cutovers/{cutover}", "cutover-execute-confirm": "/console/cutovers/{cutover}/execute",
    "cutover-rollback-confirm": "/console/cutovers/{cutover}/rollback",
    "cutover-abort-confirm": "/console/cutovers/{cutover}/abort", "cutover-gate-confirm": "/console/cutover-gate",
    "zonal-shift-confirm": "/console/zonal-shifts/new?region=eu&zone=eu-b&expires_in_h=1&reason=e2e",
    "events": "/console/events", "drills": "/console/drills", "drill-request-confirm": "/console/drills/every-page/request",
    "drill-run": "/console/drills/runs/{run}", "drill-abort-confirm": "/console/drills/runs/{run}/abort",
    "slo": "/console/slo/tiny", "refused": "/console/cutovers/999999",
}


def test_every_page_renders_and_is_screenshotted(page_for: Callable[[], Any], console: Console,
                                                 artifacts: Path) -> None:
    with console.api("operator") as api:
        planned = api.post("/api/v1/cutovers", json={"scope": {"kind": "region", "region": "us"}, "tier": "l7",
                                                     "target_state": "out", "reason": "e2e: every page"})
        assert planned.status_code == 201, planned.text
        drill = {**ZONE_DRILL, "name": "every-page", "description": "e2e: every page"}
        assert api.post("/api/v1/drills", json=drill).status_code == 201
        run = api.post("/api/v1/drills/every-page/runs")
        assert run.status_code == 201, run.text
    ids = {"cutover": planned.json()["id"], "run": run.json()["id"]}
    page = page_for()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto("/console/sign-in")
    shoot(page, artifacts, "page-sign-in")
    sign_in(page, console.tokens["operator"])
    for name, path in PAGES.items():
        errors.clear()
        response = page.goto(path.format(**ids))
        assert response is not None and response.status == (404 if name == "refused" else 200), (name, path)
        assert page.locator("main h1").count() == 1, name
        shoot(page, artifacts, f"page-{name}")
        # The CSP allows nothing inline: a page that broke it, or a static file missing, logs an error.
        assert name == "refused" or errors == [], (name, errors)
    shots = sorted(artifacts.glob("page-*.png"))
    assert {p.stem for p in shots} == {f"page-{name}" for name in (*PAGES, "sign-in")}
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 1000 for p in shots)


def test_an_open_fleet_page_says_it_is_not_current_when_the_control_plane_goes_away(
    page_for: Callable[[], Any], console: Console, artifacts: Path,
) -> None:
    """Last in the module: it restarts the control plane, which signs every session out."""
    page = page_for()
    sign_in(page, console.tokens["viewer"])
    page.wait_for_selector("#fleet-status:text('live')")
    console.cp.stop(signal.SIGKILL)
    page.wait_for_selector("#fleet-live.not-live")
    assert "control plane unreachable" in page.locator("#fleet-status").inner_text()
    shoot(page, artifacts, "fleet-controlplane-down")
    # Back on the same database and port, with a new process key: the open page's session is gone, and the
    # page says so rather than going back to looking live.
    console.cp.start()
    console.cp.wait_ready()
    page.wait_for_selector("#fleet-status:text('session ended')")
    assert page.locator("#fleet-live.not-live").count() == 1
    shoot(page, artifacts, "fleet-signed-out")
