"""A real Prometheus scrapes a real gateway; when the gateway dies, a real Alertmanager delivers the alert and the
control plane acts on it once, however often Alertmanager sends it again.

Prometheus (Debian `prometheus`) scrapes one `lifeline gateway serve` every
second, labelled as zone eu-a of region eu; its rule fires
`LifelineZoneUnserved` when that scrape fails (`up == 0`). Alertmanager
(Debian `prometheus-alertmanager`) delivers to the control plane's
receiver with the `alertmanager` token, repeating every 2 s. The routes
file turns the alert into a zone fault: the escalation ladder drains the
zone's cluster at l7. Every repeat finds the alert claimed: one event, one
cutover, deliveries counted.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from common import oneshot_http
from controlplane.alerts.models import AlertDelivery
from controlplane.db import session_scope
from lifeline.processes import GatewayProcess, free_port, gateway_config
from tests.support.served_controlplane import ControlPlane, served_controlplane
from tests.support.waiting import wait_for

ROUTES = """
[source]
receiver = "lifeline"

[[route]]
alertname = "LifelineZoneUnserved"
action = "fault"
scope = "zone"
"""
RULES = {"groups": [{"name": "test", "rules": [{
    "alert": "LifelineZoneUnserved", "expr": 'up{job="lifeline-gateway"} == 0', "for": "1s",
    "labels": {"severity": "page"}, "annotations": {"summary": "zone {{ $labels.zone }} has no gateway answering"}}]}]}


def binary(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed (make system-deps installs it)"
    return found


@pytest.fixture
def controlplane(tmp_path: Path) -> Iterator[ControlPlane]:
    routes = tmp_path / "alert-routes.toml"
    routes.write_text(ROUTES)
    with served_controlplane(tmp_path, alert_routes_file=routes) as cp:
        operator = cp.headers("operator")
        assert oneshot_http.post(f"{cp.url}/api/v1/regions", json={"name": "eu"}, headers=operator).status_code == 201
        for zone in ("eu-a", "eu-b"):
            assert oneshot_http.post(f"{cp.url}/api/v1/regions/eu/zones", json={"name": zone},
                                     headers=operator).status_code == 201
            assert oneshot_http.post(f"{cp.url}/api/v1/clusters", headers=operator, json={
                "name": f"c-{zone}", "region": "eu", "zone": zone, "model": "tiny", "weight": 100}).status_code == 201
        yield cp


def test_alertmanager_delivers_a_zone_fault_that_the_ladder_acts_on_once(
        controlplane: ControlPlane, tiny_model: Path, tmp_path: Path) -> None:
    gateway = GatewayProcess(gateway_config(tiny_model, region="eu"), free_port(), tmp_path / "gateway")
    gateway.start()
    processes: list[subprocess.Popen] = []
    try:
        gateway.wait_live()
        am_port, prom_port = free_port(), free_port()
        (tmp_path / "am.yml").write_text(yaml.safe_dump({
            "route": {"receiver": "lifeline", "group_by": ["alertname", "zone"], "group_wait": "1s",
                      "group_interval": "1s", "repeat_interval": "2s"},
            "receivers": [{"name": "lifeline", "webhook_configs": [{
                "url": f"{controlplane.url}/api/v1/alerts/alertmanager", "send_resolved": True,
                "http_config": {"authorization": {"credentials": controlplane.tokens["alertmanager"]}}}]}]}))
        (tmp_path / "rules.yml").write_text(yaml.safe_dump(RULES))
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(tmp_path / "rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "lifeline-gateway", "static_configs": [{
                "targets": [f"127.0.0.1:{gateway.port}"], "labels": {"region": "eu", "zone": "eu-a"}}]}]}))
        with open(tmp_path / "alertmanager.log", "wb") as am_log, open(tmp_path / "prometheus.log", "wb") as log:
            processes.append(subprocess.Popen([
                binary("prometheus-alertmanager"), f"--config.file={tmp_path / 'am.yml'}",
                f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address=127.0.0.1:{am_port}",
                "--cluster.listen-address="], stdout=am_log, stderr=subprocess.STDOUT))
            processes.append(subprocess.Popen([
                binary("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'prom-data'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                "--rules.alert.resend-delay=1s"], stdout=log, stderr=subprocess.STDOUT))

        def scraped_up() -> bool:
            try:
                answer = oneshot_http.get(f"http://127.0.0.1:{prom_port}/api/v1/query", params={"query": "up"}, timeout=2)
                return any(r["value"][1] == "1" for r in answer.json()["data"]["result"])
            except (httpx.HTTPError, KeyError, ValueError):
                return False

        wait_for(scraped_up, "Prometheus scraping the gateway", timeout=60, interval=0.5)
        gateway.kill()  # the zone's gateway is gone: its scrape fails, up == 0, the rule fires

        def delivered(at_least: int) -> AlertDelivery | None:
            with session_scope(controlplane.factory) as session:
                rows = [r for r in session.query(AlertDelivery).all() if r.alertname == "LifelineZoneUnserved"]
                done = [r for r in rows if r.state == "done" and r.deliveries >= at_least]
                return done[0] if done else None

        first = wait_for(lambda: delivered(1), "the alert delivered and acted on", timeout=90, interval=0.5)
        assert (first.action, first.outcome) == ("fault", "escalated"), first.detail
        repeated = wait_for(lambda: delivered(3), "Alertmanager's repeats of the same alert", timeout=60, interval=0.5)
        assert repeated.key == first.key

        viewer = controlplane.headers("viewer")
        cluster = oneshot_http.get(f"{controlplane.url}/api/v1/clusters/c-eu-a", headers=viewer).json()
        assert cluster["state"] == "draining"  # the ladder drained the zone at l7
        assert oneshot_http.get(f"{controlplane.url}/api/v1/clusters/c-eu-b", headers=viewer).json()["state"] == "active"
        cutovers = oneshot_http.get(f"{controlplane.url}/api/v1/cutovers", headers=viewer).json()
        assert len(cutovers) == 1 and cutovers[0]["mode"] == "automatic"
        events = oneshot_http.get(f"{controlplane.url}/api/v1/events", params={"limit": 1000}, headers=viewer).json()
        received = [e for e in events if e["kind"] == "alert.received"]
        assert len(received) == 1, received
        assert received[0]["scope"] == "region:eu/zone:eu-a"
        assert received[0]["reason"] == "LifelineZoneUnserved firing: zone eu-a has no gateway answering"
        assert received[0]["after"]["labels"]["job"] == "lifeline-gateway"
    finally:
        gateway.kill()
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
