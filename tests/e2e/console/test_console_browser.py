"""The operator console in a real browser: headless Debian Chromium driven by Playwright.

A real `lifeline controlplane serve` (SQLite) reads the region's lease
registry in the real Redis (127.0.0.1:6379, keys under a random prefix,
removed after); engines' leases are registered through
`contract.lease.RedisLeaseRegistry`, as engines do. Two gateway report
loops stand in for gateway replicas: each polls the snapshot with a
`gateway` token and reports the version it applied, exactly the calls a
gateway makes (PUT /api/v1/gateways/{replica}, with the snapshot's epoch),
so a cutover's l7 step verifies against them.

Playwright's own browser download cannot run here; it drives
`/usr/bin/chromium` (Debian's `chromium`, `make system-deps`) through
`executable_path`. Every page is screenshotted into one artifact directory,
printed at the end of the module (`-s` shows it).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from contract.lease import Registration, RedisLeaseRegistry
from lifeline.processes import ControlPlaneProcess

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REDIS_URL = "redis://127.0.0.1:6379/0"
TIMEOUT_MS = 20_000


class GatewayReporter:
    """A gateway replica's report loop: fetch the snapshot, report the version applied."""

    def __init__(self, base: str, token: str, replica: str, zone: str) -> None:
        self.client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=5.0)
        self.replica, self.zone = replica, zone
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"report-{replica}", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.3):
            try:
                snapshot = self.client.get("/api/v1/snapshot").json()
                now = datetime.now(UTC).isoformat()
                self.client.put(f"/api/v1/gateways/{self.replica}", json={
                    "replica_id": self.replica, "region": "eu", "zone": self.zone, "routing_source": "snapshot",
                    "snapshot_version": snapshot["version"], "snapshot_epoch": snapshot["controlplane_epoch"],
                    "snapshot_applied_at": now, "reported_at": now})
            except httpx.HTTPError:
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.client.close()


def run_async(coroutine: Callable[[], Any]) -> None:
    """Run a coroutine on a thread of its own: Playwright's sync API holds an event loop on this one."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(coroutine())
        except BaseException as exc:  # re-raised in the test's thread
            failure.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=30)
    if failure:
        raise failure[0]


def _artifact(root: Path, version: str) -> Path:
    location = root / version
    location.mkdir(parents=True)
    (location / "config.json").write_text(json.dumps({"architectures": ["Tiny"], "hidden_size": 8}))
    (location / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}}))
    (location / "model.safetensors").write_bytes(version.encode() * 256)
    return location


class Console:
    def __init__(self, cp: ControlPlaneProcess, tokens: dict[str, str], artifacts: Path, prefix: str) -> None:
        self.cp, self.tokens, self.artifacts, self.prefix = cp, tokens, artifacts, prefix

    @property
    def url(self) -> str:
        return self.cp.url

    def api(self, role: str) -> httpx.Client:
        return httpx.Client(base_url=self.cp.url, headers={"Authorization": f"Bearer {self.tokens[role]}"},
                            timeout=30.0)

    def registry(self) -> RedisLeaseRegistry:
        return RedisLeaseRegistry.from_url(REDIS_URL, region="eu", prefix=self.prefix, ttl=timedelta(minutes=10))


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    shots = tmp_path_factory.mktemp("console-screenshots")
    yield shots
    print(f"\nconsole screenshots: {shots}")


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    workdir = tmp_path_factory.mktemp("console-cp")
    prefix = f"console-e2e-{secrets.token_hex(4)}"
    # The agent's reports go stale quickly here, so a test can watch a quiet agent's verdicts turn stale.
    cp = ControlPlaneProcess(workdir=workdir, env={"LIFELINE_CONTROLPLANE_LEASE_REDIS_URL": REDIS_URL,
                                                   "LIFELINE_CONTROLPLANE_LEASE_KEY_PREFIX": prefix,
                                                   "LIFELINE_CONTROLPLANE_AGENT_REPORT_STALE_AFTER": "PT3S"})
    tokens = {role: cp.create_token(role, name=f"e2e-{role}")
              for role in ("viewer", "operator", "admin", "gateway", "agent")}
    root = workdir / "artifacts"
    for version in ("v1", "v2"):
        cp.cli("catalog", "register", "tiny", version, str(_artifact(root, version)))
    cp.cli("catalog", "promote", "tiny", "prod", "v1", "--reason", "first")
    cp.start()
    reporters: list[GatewayReporter] = []
    store = redis.Redis.from_url(REDIS_URL)
    try:
        cp.wait_ready()
        c = Console(cp, tokens, root, prefix)
        with c.api("operator") as api:
            for region, zones in (("eu", ("eu-a", "eu-b")), ("us", ("us-a",))):
                assert api.post("/api/v1/regions", json={"name": region}).status_code == 201
                for zone in zones:
                    assert api.post(f"/api/v1/regions/{region}/zones", json={"name": zone}).status_code == 201
                    created = api.post("/api/v1/clusters", json={"name": f"c-{zone}", "region": region,
                                                                 "zone": zone, "model": "tiny", "weight": 100})
                    assert created.status_code == 201, created.text

        async def register() -> None:
            registry = c.registry()
            for instance, zone in (("engine-1", "eu-a"), ("engine-2", "eu-b")):
                await registry.register(Registration(instance_id=instance, url=f"http://127.0.0.1:1/{instance}",
                                                     version="v1", zone=zone, region="eu"))
            await registry.close()

        run_async(register)
        reporters = [GatewayReporter(cp.url, tokens["gateway"], "gw-eu-1", "eu-a"),
                     GatewayReporter(cp.url, tokens["gateway"], "gw-eu-2", "eu-b")]
        for reporter in reporters:
            reporter.thread.start()
        yield c
    finally:
        for reporter in reporters:
            reporter.close()
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
    engine_1 = page.locator('[data-testid="instance-engine-1"]')
    assert "v1" in engine_1.inner_text() and "live" in engine_1.inner_text()
    # No reload from here on: the page's body refreshes itself.
    page.wait_for_selector("#fleet-status:text('live')")
    page.wait_for_function("document.querySelectorAll('[data-testid^=\"gateway-gw-eu-\"]').length === 2")
    assert "current" in page.locator('[data-testid="gateway-gw-eu-1"]').inner_text()

    # The region's agent reports a probe verdict and a canary for engine-1, and a warm pool instance.
    agent_reports(console, [
        {"instance_id": "engine-1", "zone": "eu-a", "version": "v1", "url": "http://127.0.0.1:1/engine-1",
         "origin": "registry", "verdict": "wrong_output", "verdict_reason": "canary tokens differ at position 3",
         "verdict_since": datetime.now(UTC).isoformat(), "canary_verdict": "wrong_output",
         "canary_at": datetime.now(UTC).isoformat(), "canaries": 2},
        {"instance_id": "pool-eu-b-1", "zone": "eu-b", "version": "v1", "url": "http://127.0.0.1:1/pool",
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

    async def kill() -> None:  # the engine goes away and releases its lease, as a stopped engine does
        registry = console.registry()
        lease = next(x for x in await registry.live() if x.instance_id == "engine-2")
        await registry.release("engine-2", lease.generation)
        await registry.close()

    run_async(kill)
    page.wait_for_selector('[data-testid="instance-engine-2"]', state="detached")  # it leaves the open page
    assert page.locator('[data-testid="instance-engine-1"]').count() == 1


def test_promote_an_alias_and_see_every_gateway_apply_it(page_for: Callable[[], Any], console: Console,
                                                        artifacts: Path) -> None:
    page = page_for()
    sign_in(page, console.tokens["operator"])
    with console.api("viewer") as api:
        before = api.get("/api/v1/snapshot").json()["version"]
    page.get_by_role("link", name="Catalog", exact=True).click()
    form = page.locator('[data-testid="promote-tiny"]')
    form.locator("select[name=version]").select_option("v2")
    form.locator("input[name=reason]").fill("v2 passed canary")
    form.get_by_role("button", name="Promote").click()
    page.wait_for_load_state()
    row = page.locator('[data-testid="alias-tiny-prod"]')
    assert row.locator('[data-testid="alias-version"]').inner_text() == "v2"
    row.locator("summary").click()
    assert "v1 → v2" in row.inner_text() and "v2 passed canary" in row.inner_text()
    shoot(page, artifacts, "catalog")

    page.get_by_role("link", name="Fleet", exact=True).click()

    def applied() -> bool:  # no reload: the fleet page follows the gateways' reports by itself
        texts = [page.locator(f'[data-testid="gateway-gw-eu-{n}"]').inner_text() for n in (1, 2)]
        # a promote advances the snapshot version by exactly one
        return all(f"v{before + 1}" in t and "current" in t for t in texts)

    until(applied, "every gateway applies the promoted snapshot")


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
    link = timeline.locator("#timeline-rows tr.fresh").first.get_by_role("link")
    assert link.get_attribute("href").startswith("/console/cutovers/")
    shoot(timeline, artifacts, "events")

    page.get_by_test_id("review-rollback").click()
    page.fill("#rb-reason", "eu-a recovered")
    page.get_by_role("button", name="Roll back cutover").click()
    page.wait_for_selector('[data-testid="cutover-state"]:text("rolled_back")')
    timeline.wait_for_selector("#timeline-rows tr.fresh:has-text('cutover.rollback_step')")
    page.get_by_role("link", name="Cutovers", exact=True).click()
    shoot(page, artifacts, "cutovers")


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
    page.get_by_role("button", name="Request a run of lose-eu-b v1").click()
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
                                form={"csrf_token": csrf, "alias": "prod", "version": "v1", "reason": "x"})
    assert refused.status == 403


def test_keyboard_only_sign_in_plan_and_execute(page_for: Callable[[], Any], console: Console,
                                                artifacts: Path) -> None:
    page = page_for()
    page.goto("/console/sign-in")
    assert page.evaluate("document.activeElement.id") == "token"  # autofocus: type at once
    page.keyboard.type(console.tokens["operator"])
    page.keyboard.press("Enter")
    page.wait_for_url("**/console/fleet")
    page.keyboard.press("Tab")  # on every page the skip link comes first
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"

    def tab_to(check: str, what: str) -> None:
        for _ in range(80):
            page.keyboard.press("Tab")
            if page.evaluate(check):
                return
        raise AssertionError(f"Tab never reached {what}")

    tab_to("document.activeElement.textContent === 'Cutovers'", "the Cutovers link")
    page.keyboard.press("Enter")
    page.wait_for_url("**/console/cutovers")
    tab_to("document.activeElement.id === 'pl-kind'", "the plan form")
    page.keyboard.press("Tab")   # region (first: eu)
    page.keyboard.press("Tab")   # zone / instance
    page.keyboard.type("eu-b")
    tab_to("document.activeElement.id === 'pl-reason'", "the reason")
    page.keyboard.type("keyboard drill")
    page.keyboard.press("Enter")
    page.wait_for_url("**/console/cutovers/*")
    tab_to("document.activeElement.dataset.testid === 'review-execute'", "Review and execute")
    page.keyboard.press("Enter")
    page.wait_for_url("**/execute")
    tab_to("document.activeElement.textContent.startsWith('Execute cutover')", "the Execute button")
    page.keyboard.press("Enter")
    page.wait_for_selector('[data-testid="cutover-state"]:text("completed")')
    shoot(page, artifacts, "keyboard-completed")
    tab_to("document.activeElement.dataset.testid === 'review-rollback'", "Review and roll back")
    page.keyboard.press("Enter")
    page.wait_for_url("**/rollback")
    tab_to("document.activeElement.id === 'rb-reason'", "the rollback reason")
    page.keyboard.type("done")
    page.keyboard.press("Enter")
    page.wait_for_selector('[data-testid="cutover-state"]:text("rolled_back")')
