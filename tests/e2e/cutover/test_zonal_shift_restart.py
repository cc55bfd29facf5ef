"""A zonal shift on real BIRD 2 + ExaBGP outlives a SIGKILLed control plane and expires by itself in the next one.

`lifeline controlplane serve` (SQLite) with a drivers file whose
`[anycast]` table names two zones' ExaBGP speakers and the observing BIRD.
`POST /api/v1/zonal-shifts` withdraws zone-a (BIRD: zone-b's path is
best); the process is SIGKILLed before the expiry; a new process on the
same database finds the shift in its expiry loop and reverts it when it is
due: zone-a's path is back at BIRD, the shift ends `expired` by the expiry
actor, and its cutover is rolled back with its own events.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from common import oneshot_http
from lifeline.processes import ControlPlaneProcess
from tests.integration.cutover.conftest import AnycastLab, anycast_lab  # noqa: F401 - fixture

EXPIRES_IN_S = 20  # long enough that the first process is killed well before it; the second reverts it


def _drivers_file(tmp_path: Path, lab: AnycastLab) -> Path:
    zones = "".join(f"""
[[anycast.zones]]
region = "eu"
zone = "{zone}"
next_hop = "{target.next_hop}"
command_fifo = "{lab.speakers[zone].command_fifo}"
ack_fifo = "{lab.speakers[zone].ack_fifo}"
""" for zone, target in lab.targets.items())
    path = tmp_path / "drivers.toml"
    path.write_text(f"""
[policy]
expiry_interval = 0.2
[anycast]
prefix = "{lab.targets["zone-a"].prefix}"
birdc_socket = "{lab.router.socket_path}"
{zones}""")
    return path


@pytest.fixture
def plane(tmp_path: Path, anycast_lab: AnycastLab) -> Iterator[ControlPlaneProcess]:  # noqa: F811 - fixture
    process = ControlPlaneProcess(tmp_path / "cp", env={
        "LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE": str(_drivers_file(tmp_path, anycast_lab))})
    try:
        yield process
    finally:
        process.stop()


def _paths(lab: AnycastLab) -> list[tuple[str, bool]]:
    paths, _ = lab.driver.observer.paths(lab.targets["zone-a"].prefix)
    return sorted((p.next_hop, p.best) for p in paths)


def _shift_row(plane: ControlPlaneProcess, shift_id: int) -> dict[str, Any]:
    engine = create_engine(plane.environment()["LIFELINE_CONTROLPLANE_DATABASE_URL"])
    try:
        with engine.connect() as connection:
            row = connection.execute(text("SELECT ended_at, end_reason, ended_by FROM zonal_shifts WHERE id = :id"),
                                     {"id": shift_id}).mappings().one()
            return dict(row)
    finally:
        engine.dispose()


def test_zonal_shift_withdraws_at_bird_survives_sigkill_and_expires_in_the_restarted_control_plane(
    plane: ControlPlaneProcess, anycast_lab: AnycastLab,  # noqa: F811 - fixture
) -> None:
    token = plane.create_token("operator", "shift-op")
    headers = {"Authorization": f"Bearer {token}"}
    plane.start()
    plane.wait_ready()
    api = f"{plane.url}/api/v1"
    for method, path, body in (
        ("POST", "/regions", {"name": "eu"}), ("POST", "/regions/eu/zones", {"name": "zone-a"}),
        ("POST", "/regions/eu/zones", {"name": "zone-b"}),
        ("POST", "/clusters", {"name": "c-a", "region": "eu", "zone": "zone-a", "model": "m"}),
        ("POST", "/clusters", {"name": "c-b", "region": "eu", "zone": "zone-b", "model": "m"}),
    ):
        assert oneshot_http.request(method, api + path, json=body, headers=headers, timeout=30).status_code == 201
    a_hop, b_hop = anycast_lab.targets["zone-a"].next_hop, anycast_lab.targets["zone-b"].next_hop
    assert [hop for hop, _ in _paths(anycast_lab)] == sorted([a_hop, b_hop])

    started = oneshot_http.post(f"{api}/zonal-shifts", headers=headers, timeout=60, json={
        "region": "eu", "zone": "zone-a", "expires_in": EXPIRES_IN_S, "reason": "zone-a packet loss"})
    assert started.status_code == 201, started.text
    shift = started.json()
    assert shift["active"] is True
    assert _paths(anycast_lab) == [(b_hop, True)]  # zone-a withdrawn: the other zone's path is best

    plane.stop(signal.SIGKILL)
    assert _shift_row(plane, shift["id"])["ended_at"] is None  # the dead process did not end it
    assert _paths(anycast_lab) == [(b_hop, True)]  # and nothing else announces zone-a meanwhile

    plane.start()  # same database, same drivers file: only the database remembers the shift
    plane.wait_ready()
    deadline = time.monotonic() + EXPIRES_IN_S + 60
    while a_hop not in [hop for hop, _ in _paths(anycast_lab)]:
        assert time.monotonic() < deadline, plane.log_path.read_text()[-3000:]
        time.sleep(0.2)
    ended = _shift_row(plane, shift["id"])
    while ended["ended_at"] is None:  # the path is back a moment before the shift's row says so
        assert time.monotonic() < deadline, plane.log_path.read_text()[-3000:]
        time.sleep(0.1)
        ended = _shift_row(plane, shift["id"])
    assert (ended["end_reason"], ended["ended_by"]) == ("expired", "controlplane:zonal-shift-expiry")
    assert sorted(hop for hop, _ in _paths(anycast_lab)) == sorted([a_hop, b_hop])

    cutover = oneshot_http.get(f"{api}/cutovers/{shift['cutover_id']}", headers=headers, timeout=30).json()
    assert cutover["state"] == "rolled_back"
    assert [(s["tier"], s["status"]) for s in cutover["steps"]] == [("l7", "reverted"), ("anycast", "reverted")]
    events = oneshot_http.get(f"{api}/events", params={"scope": "region:eu/zone:zone-a"}, headers=headers,
                              timeout=30).json()
    kinds = [e["kind"] for e in events]
    assert kinds.count("zonal_shift.start") == 1 and kinds.count("zonal_shift.expired") == 1
    reverts = [e for e in events if e["kind"] == "cutover.rollback_step"]
    assert sorted(e["routing_tier"] for e in reverts) == ["anycast", "l7"]
    assert all(e["outcome"] == "succeeded" for e in reverts)
