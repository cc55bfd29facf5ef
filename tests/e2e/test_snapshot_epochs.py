"""A gateway moved between two control planes with different databases follows each one's versions (real processes).

Two `lifeline controlplane serve` processes (`SnapshotFleet`, as in
`test_snapshot_gateways.py`), each on its own fresh SQLite database, so each
has its own `controlplane_epoch` and counts snapshot versions from zero. A
holds `prod = tiny-seed0` (`canary = tiny-seed1`) and has moved it back and forth, so its version is
well above B's, whose `prod = tiny-seed1`. One gateway process and two
engines (one per version) share a Redis lease registry.

The gateway first polls A through `SwitchingAddress`, an HTTP proxy standing
for the address the gateway is configured with (a load balancer, a DNS
name). The address is then moved to B without restarting the gateway: its
next poll carries A's ETag to B, and B's snapshot — a lower version from
another epoch — must be applied, cached on disk, and reported to B with B's
epoch. Then the gateway is restarted pointed straight at A (its disk copy is
B's): A's snapshot applies again. Before epochs, the gateway refused B's
snapshot as "older" and served A's routing indefinitely.

Gateway tokens are per control plane; the proxy presents the current
upstream's, as the two control planes' operators would each have issued one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from bench.snapshot_propagation import MODEL, SnapshotFleet, answer, wait_answer
from common import oneshot_http
from lifeline.processes import built_model

pytestmark = pytest.mark.long  # scheduled first in its tier (tests/conftest.py)

SEED0, SEED1 = "tiny-seed0", "tiny-seed1"
_HOP_BY_HOP = {"host", "content-length", "connection", "accept-encoding", "transfer-encoding", "content-encoding"}


class SwitchingAddress:
    """One address in front of whichever control plane `use()` names, with that control plane's gateway token."""

    def __init__(self) -> None:
        self.upstream = ""
        self.token = ""
        self.seen_if_none_match: list[tuple[str, str | None]] = []
        address = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                headers["Authorization"] = f"Bearer {address.token}"
                upstream = address.upstream
                if self.path.startswith("/api/v1/snapshot"):
                    address.seen_if_none_match.append((upstream, self.headers.get("If-None-Match")))
                try:
                    response = oneshot_http.request(self.command, upstream + self.path, content=body, headers=headers,
                                                    timeout=10)
                except httpx.TransportError:
                    self.send_response(502)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(response.status_code)
                for key, value in response.headers.items():
                    if key.lower() not in _HOP_BY_HOP:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(response.content)))
                self.end_headers()
                self.wfile.write(response.content)

            do_GET = do_PUT = do_POST = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def use(self, fleet: SnapshotFleet) -> None:
        self.token, self.upstream = fleet.gateway_token, fleet.cp_url

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class TwoControlPlanes:
    def __init__(self, a: SnapshotFleet, b: SnapshotFleet, address: SwitchingAddress) -> None:
        self.a, self.b, self.address = a, b, address


@pytest.fixture(scope="module")
def planes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoControlPlanes]:
    versions = {p.name: p for p in (built_model("tiny", 0), built_model("tiny", 1))}
    root = tmp_path_factory.mktemp("two-control-planes")
    a, b = SnapshotFleet(root / "a", versions), SnapshotFleet(root / "b", versions)
    address = SwitchingAddress()
    try:
        a.start_controlplane({"prod": SEED0, "canary": SEED1})  # canary: so both versions answer by name
        for _ in range(3):  # A's versions climb well past anything B will reach in this test
            a.promote("prod", SEED1, reason="e2e: climb")
            a.rollback("prod", reason="e2e: climb")
        b.start_controlplane({"prod": SEED1})  # a fresh database: its own epoch, versions from zero
        address.use(a)
        a.gateway_controlplane_url = address.url
        gateway = a.start_gateway("gw-1")
        a.start_engine("eng-0", SEED0)
        a.start_engine("eng-1", SEED1)
        gateway.wait_routable(MODEL, 1)
        yield TwoControlPlanes(a, b, address)
    finally:
        a.close()
        b.stop_controlplane()
        address.close()


def _until(condition: Callable[[], object], timeout: float = 30.0, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.1)
    raise AssertionError(f"never happened within {timeout:.0f}s: {what}")


def _snapshot(fleet: SnapshotFleet) -> dict:
    return fleet.api("GET", "/snapshot").json()


def _report(fleet: SnapshotFleet, replica: str) -> dict | None:
    return next((g for g in fleet.api("GET", "/gateways").json() if g["replica_id"] == replica), None)


def test_a_gateway_moved_to_a_fresh_database_applies_its_lower_versions_and_back(planes: TwoControlPlanes):
    a, b, address = planes.a, planes.b, planes.address
    gateway = a.gateways[0]
    cache = a.workdir / gateway.replica_id / "snapshot.json"
    seed0 = _until(lambda: answer(gateway.url, SEED0), what="seed0 answers")
    seed1 = _until(lambda: answer(gateway.url, SEED1), what="seed1 answers")
    assert seed0 != seed1
    snap_a, snap_b = _snapshot(a), _snapshot(b)
    assert snap_a["controlplane_epoch"] != snap_b["controlplane_epoch"]
    assert snap_a["version"] > snap_b["version"] + 3  # B's snapshot is "older" by number
    wait_answer(gateway.url, MODEL, seed0)
    _until(lambda: (r := _report(a, "gw-1")) and r["snapshot_version"] == snap_a["version"]
           and r["snapshot_epoch"] == snap_a["controlplane_epoch"] and not r["foreign_epoch"],
           what="the gateway reports A's snapshot to A")

    # The address moves to B; the gateway keeps running and polls with A's ETag.
    address.use(b)
    wait_answer(gateway.url, MODEL, seed1, timeout=30.0)
    on_disk = json.loads(cache.read_text())
    assert (on_disk["version"], on_disk["controlplane_epoch"]) == (snap_b["version"], snap_b["controlplane_epoch"])
    report = _until(lambda: (r := _report(b, "gw-1")) and r["snapshot_epoch"] == snap_b["controlplane_epoch"] and r,
                    what="the gateway reports B's snapshot to B")
    assert report["snapshot_version"] == snap_b["version"] and not report["foreign_epoch"]  # type: ignore[index]
    assert (b.cp_url, f'"snapshot-{snap_a["controlplane_epoch"]}-{snap_a["version"]}"') in address.seen_if_none_match
    refused = b.api("GET", "/events", params={"kind": "snapshot.refused", "limit": 100}).json()
    assert refused == []  # B's snapshot was never taken for an older one

    # Within B, versions count as before: a change there is applied.
    b.promote("prod", SEED0, reason="e2e: on B")
    wait_answer(gateway.url, MODEL, seed0)
    newer_b = _snapshot(b)["version"]
    _until(lambda: (r := _report(b, "gw-1")) and r["snapshot_version"] == newer_b, what="B's newer version reported")

    # Restarted pointed straight at A, on B's copy on disk: A's snapshot (another epoch again) applies.
    a.promote("prod", SEED1, reason="e2e: on A")
    gateway.config["routing"].update(controlplane_url=a.cp_url, token=a.gateway_token)
    a.restart_gateway(gateway)
    wait_answer(gateway.url, MODEL, seed1, timeout=30.0)
    assert json.loads(cache.read_text())["controlplane_epoch"] == snap_a["controlplane_epoch"]
    _until(lambda: (r := _report(a, "gw-1")) and r["snapshot_version"] == _snapshot(a)["version"]
           and not r["foreign_epoch"], what="the gateway reports A's snapshot to A again")
