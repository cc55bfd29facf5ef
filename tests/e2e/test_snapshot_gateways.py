"""Two gateways route by the real control plane's snapshot, on real processes (issue 8).

`lifeline controlplane serve` (SQLite, `lifeline.processes.ControlPlaneProcess`)
holds two registered versions of the tiny model; alias moves go through the
catalog (`lifeline catalog promote|rollback`). Two gateways (routing.source
snapshot, a `gateway`-role token) and two engines share one Redis lease
registry, which the control plane reads for observed instances.

Promote and rollback reach both gateways and both report the applied
version; with the control plane down they serve (and restart) from the
snapshot on disk and catch up when it returns; an invalid snapshot is
refused by both; an operator's ejection reaches both; the gateways' own L7
ejections reach the event log; observed instances match the engines running.

The real control plane only ever serves snapshots that pass
`RoutingSnapshot` validation (it builds them with that model), so the
invalid one is injected by `SnapshotRewritingProxy`: the gateways talk to
the control plane through it, and while a test sets `poison_from` it
rewrites each snapshot of that version or newer so that alias `prod` names a
version the snapshot does not describe. Everything else passes through.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from bench.snapshot_propagation import MODEL, REGION, SnapshotFleet, answer, wait_answer
from common import oneshot_http
from lifeline.processes import built_model

pytestmark = pytest.mark.long  # scheduled first in its tier (tests/conftest.py)

SEED0, SEED1 = "tiny-seed0", "tiny-seed1"
_HOP_BY_HOP = {"host", "content-length", "connection", "accept-encoding", "transfer-encoding", "content-encoding"}


class SnapshotRewritingProxy:
    """An HTTP proxy in front of the control plane that can rewrite the snapshot it serves (see the module docstring)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.poison_from: int | None = None
        self.rewritten = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                try:
                    upstream = oneshot_http.request(self.command, proxy.upstream + self.path, content=body, headers=headers,
                                                    timeout=10)
                except httpx.TransportError:
                    self.send_response(502)  # the control plane is down: the gateway sees no usable answer
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                content = proxy._rewrite(self.path, upstream)
                self.send_response(upstream.status_code)
                for key, value in upstream.headers.items():
                    if key.lower() not in _HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_PUT = do_POST = do_DELETE = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _rewrite(self, path: str, response: httpx.Response) -> bytes:
        poison_from = self.poison_from
        if poison_from is None or not path.startswith("/api/v1/snapshot") or response.status_code != 200:
            return response.content
        body = response.json()
        if body["version"] < poison_from:
            return response.content
        body["models"][MODEL]["aliases"]["prod"]["version"] = "tiny-seed9"  # described nowhere in the snapshot
        self.rewritten += 1
        return json.dumps(body).encode()

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SnapshotFleet]:
    versions = {p.name: p for p in (built_model("tiny", 0), built_model("tiny", 1))}
    fleet = SnapshotFleet(tmp_path_factory.mktemp("snapshot-fleet"), versions)
    proxy = SnapshotRewritingProxy(fleet.cp_url)
    proxy.start()
    fleet.gateway_controlplane_url = proxy.url
    fleet.proxy = proxy  # type: ignore[attr-defined]
    try:
        fleet.start_controlplane({"prod": SEED0, "canary": SEED1})
        for replica in ("gw-a", "gw-b"):
            fleet.start_gateway(replica)
        fleet.start_engine("eng-0", SEED0)
        fleet.start_engine("eng-1", SEED1)
        for gateway in fleet.gateways:
            gateway.wait_routable(MODEL, 1)
            gateway.wait_routable(f"{MODEL}:canary", 1)
        yield fleet
    finally:
        fleet.close()
        proxy.close()


@pytest.fixture(scope="module")
def reference(fleet: SnapshotFleet) -> dict[str, tuple[int, ...]]:
    tokens = {v: answer(fleet.gateways[0].url, v) for v in (SEED0, SEED1)}
    assert None not in tokens.values() and tokens[SEED0] != tokens[SEED1]  # answers name their version
    return tokens  # type: ignore[return-value]


def _until(condition: Callable[[], object], timeout: float = 20.0, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.1)
    raise AssertionError(f"never happened within {timeout:.0f}s: {what}")


def _catalog(fleet: SnapshotFleet, *args: str) -> None:
    """`lifeline catalog …` on the control plane's database: what an operator runs, API up or down."""
    fleet.controlplane.cli("catalog", *args)


def _reports(fleet: SnapshotFleet) -> dict[str, dict]:
    return {g["replica_id"]: g for g in fleet.api("GET", "/gateways").json()}


def _every_gateway_reports(fleet: SnapshotFleet, predicate: Callable[[dict], bool]) -> bool:
    reports = _reports(fleet)
    return all(g.replica_id in reports and predicate(reports[g.replica_id]) for g in fleet.gateways)


def _l7_events(fleet: SnapshotFleet, kind: str) -> list[dict]:
    return fleet.api("GET", "/events", params={"routing_tier": "l7", "kind": kind, "limit": 1000}).json()


def _live_instances(fleet: SnapshotFleet) -> dict[str, dict]:
    return {i["instance_id"]: i for i in fleet.api("GET", f"/regions/{REGION}/instances").json() if i["live"]}


def test_promote_and_rollback_take_effect_at_both_gateways(fleet, reference):
    for target, move in ((SEED1, ("promote", MODEL, "prod", SEED1)), (SEED0, ("rollback", MODEL, "prod"))):
        _catalog(fleet, *move, "--reason", "e2e")
        version = fleet.snapshot_version()
        for gateway in fleet.gateways:
            wait_answer(gateway.url, MODEL, reference[target])
        # Each replica reports the applied version, so a cutover step can verify the L7 change.
        reports = _until(lambda version=version: (r := _reports(fleet)) and all(  # type: ignore[misc]
            r.get(g.replica_id, {}).get("snapshot_version") == version for g in fleet.gateways) and r,
            what=f"both gateways report snapshot {version}")
        for report in reports.values():  # type: ignore[union-attr]
            assert report["routing_source"] == "snapshot" and not report["stale"]
            # Only what the snapshot routes to: after the promote nothing names seed0, so eng-0 is not listed.
            expected = {"eng-0", "eng-1"} if target == SEED0 else {"eng-1"}
            assert {e["instance_id"] for e in report["live_endpoints"]} == expected
    moves = fleet.api("GET", f"/catalog/models/{MODEL}/aliases/prod/history").json()
    assert len(moves) >= 3  # the initial promote, the promote, the rollback: all in the catalog


def test_gateways_serve_from_disk_while_the_control_plane_is_down_and_catch_up(fleet, reference):
    for gateway in fleet.gateways:
        wait_answer(gateway.url, MODEL, reference[SEED0])
    fleet.stop_controlplane()
    a, b = fleet.gateways
    assert answer(a.url, MODEL) == reference[SEED0]
    fleet.restart_gateway(b)  # a cold start with the control plane away: only the disk copy to go on
    b.wait_routable(MODEL, 1)
    assert answer(b.url, MODEL) == reference[SEED0]
    assert answer(b.url, f"{MODEL}:canary") == reference[SEED1]

    # The catalog CLI works on the database while the API is down; the gateways cannot see the move yet.
    _catalog(fleet, "promote", MODEL, "prod", SEED1, "--reason", "e2e: API down")
    for gateway in fleet.gateways:
        assert answer(gateway.url, MODEL) == reference[SEED0]

    fleet.start_controlplane()  # it returns, on the same database
    for gateway in fleet.gateways:
        wait_answer(gateway.url, MODEL, reference[SEED1])
    version = fleet.snapshot_version()
    _until(lambda: _every_gateway_reports(fleet, lambda r: r["snapshot_version"] == version),
           what=f"both gateways report snapshot {version} after the control plane returned")


def test_an_invalid_snapshot_is_refused_by_both_and_the_old_one_stays(fleet, reference):
    good = fleet.snapshot_version()
    _until(lambda: _every_gateway_reports(fleet, lambda r: r["snapshot_version"] == good),
           what=f"both gateways apply snapshot {good}")
    for gateway in fleet.gateways:
        wait_answer(gateway.url, MODEL, reference[SEED1])
    fleet.proxy.poison_from = good + 1  # type: ignore[attr-defined]
    try:
        _catalog(fleet, "rollback", MODEL, "prod", "--reason", "e2e: poisoned")  # the control plane serves good + 1
        assert fleet.snapshot_version() == good + 1
        refused = _until(lambda: {e["actor"] for e in _l7_events(fleet, "snapshot.refused")}
                         >= {"gateway:gw-a", "gateway:gw-b"}, what="both gateways send snapshot.refused")
        assert refused and fleet.proxy.rewritten >= 2  # type: ignore[attr-defined]
        for gateway in fleet.gateways:
            assert answer(gateway.url, MODEL) == reference[SEED1]
            assert json.loads((fleet.workdir / gateway.replica_id / "snapshot.json").read_text())["version"] == good
        assert _every_gateway_reports(fleet, lambda r: r["snapshot_version"] == good)
    finally:
        fleet.proxy.poison_from = None  # type: ignore[attr-defined]
    for gateway in fleet.gateways:  # the same version, served intact, applies
        wait_answer(gateway.url, MODEL, reference[SEED0])


def test_observed_instances_match_the_engines_running(fleet, reference):
    leases = fleet.gateways[0].leases()
    observed = _live_instances(fleet)
    assert set(observed) == {e.instance_id for e in fleet.engines} == set(leases)
    for instance_id, instance in observed.items():
        assert instance["generation"] == leases[instance_id] and not instance["ejected"]
    assert {i: o["version"] for i, o in observed.items()} == {"eng-0": SEED0, "eng-1": SEED1}


def test_an_operators_ejection_removes_the_instance_at_both_gateways(fleet, reference):
    generation = fleet.gateways[0].leases()["eng-1"]
    ejection = fleet.api("POST", f"/regions/{REGION}/ejections",
                         json={"instance_id": "eng-1", "generation": generation, "reason": "bad canary"}).json()
    version = fleet.snapshot_version()
    try:
        for gateway in fleet.gateways:
            canary = f"{gateway.url}/v1/completions"
            refused = _until(lambda canary=canary: (r := oneshot_http.post(canary, json={  # type: ignore[misc]
                "model": f"{MODEL}:canary", "prompt": "x", "max_tokens": 2}, timeout=10)).status_code == 503 and r,
                what=f"{gateway.replica_id} stops routing to eng-1")
            assert refused.json()["error"]["type"] == "no_healthy_endpoint"  # type: ignore[union-attr]
            assert answer(gateway.url, MODEL) == reference[SEED0]
        _until(lambda: _every_gateway_reports(fleet, lambda r: r["ejected"] == 1 and r["snapshot_version"] >= version),
               what="both gateways report one ejected instance")
        assert _live_instances(fleet)["eng-1"]["ejected"]
    finally:
        fleet.api("DELETE", f"/regions/{REGION}/ejections/{ejection['id']}", params={"reason": "e2e: lifted"})
    for gateway in fleet.gateways:
        wait_answer(gateway.url, f"{MODEL}:canary", reference[SEED1])


def test_a_gateways_own_ejection_is_an_l7_event(fleet, reference):
    gateway = fleet.gateways[0]
    wait_answer(gateway.url, f"{MODEL}:canary", reference[SEED1])
    victim = next(e for e in fleet.engines if e.instance_id == "eng-1")
    victim.kill(signal.SIGKILL)  # its lease is still live for up to a TTL: the gateway finds out by connecting
    oneshot_http.post(f"{gateway.url}/v1/completions", json={"model": f"{MODEL}:canary", "prompt": "x", "max_tokens": 2},
                      timeout=30)
    event = _until(lambda: next((e for e in _l7_events(fleet, "instance.suppressed")
                                 if e["scope"].endswith("instance:eng-1")), None),
                   what="the gateway's ejection of eng-1 reaches the control plane's event log")
    assert event["actor"] == f"gateway:{gateway.replica_id}" and event["routing_tier"] == "l7"  # type: ignore[index]
    assert event["reason"] and event["after"]["generation"] is not None  # type: ignore[index]
    # The dead engine's lease lapses: observed instances follow the engines running.
    _until(lambda: set(_live_instances(fleet)) == {"eng-0"}, what="only eng-0 is observed live")
