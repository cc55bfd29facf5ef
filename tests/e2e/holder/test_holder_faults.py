"""The holder itself fails: SIGKILLed, restarted, its region corrupted, its ledger torn.

Promises tested: service recovery without the holder (engines that cannot
attach load from disk and say so; engines already attached serve on from the
pages they mapped) and miss-never-misuse (a restarted holder adopts a region
only if its checksum still matches the seal; a corrupted one is discarded and
reloaded, and every engine's tokens stay identical to a disk-loaded run).
"""

from __future__ import annotations

import signal
import threading

import httpx

from common import oneshot_http
from lifeline.processes import scrape_metric
from tests.e2e.holder.conftest import PROMPT, completion_tokens, wait_for, weights_origin

MAX_TOKENS = 16


def test_holder_killed_engines_serve_on_or_fall_back_to_disk_and_say_so(fleet_factory):
    fleet = fleet_factory()
    holder = fleet.start_holder()
    attached = fleet.start_engine("attached", ["--holder", holder.url])
    expected = completion_tokens(attached.url, PROMPT, MAX_TOKENS)

    holder.kill(signal.SIGKILL)
    assert holder.process.returncode == -signal.SIGKILL
    # Already attached: the mapped pages outlive the holder; the engine notices and says so.
    wait_for(lambda: not weights_origin(attached)["holder_connected"], "the engine to notice the holder is gone")
    assert scrape_metric(f"{attached.url}/metrics", "lifeline_engine_holder_connected") == 0
    assert completion_tokens(attached.url, PROMPT, MAX_TOKENS) == expected

    # Starting while the holder is dead: load from disk, and say why.
    fallback = fleet.start_engine("fallback", ["--holder", holder.url])
    origin = weights_origin(fallback)
    assert origin["source"] == "disk"
    assert "unreachable" in origin["fallback_reason"]
    assert scrape_metric(f"{fallback.url}/metrics", "lifeline_engine_holder_fallbacks_total") == 1
    assert scrape_metric(f"{fallback.url}/metrics", "lifeline_engine_weights_from_holder") == 0
    assert "holder unavailable; loading weights from disk" in fallback.logs()
    assert completion_tokens(fallback.url, PROMPT, MAX_TOKENS) == expected


def test_restarted_holder_adopts_its_region_and_tenants_renew(fleet_factory):
    fleet = fleet_factory()
    holder = fleet.start_holder()
    engine = fleet.start_engine("engine-a", ["--holder", holder.url])
    expected = completion_tokens(engine.url, PROMPT, MAX_TOKENS)
    sealed = holder.state()["regions"]
    holder.kill(signal.SIGKILL)
    wait_for(lambda: not weights_origin(engine)["holder_connected"], "the engine to notice the holder is gone")

    again = fleet.start_holder(port=holder.port)
    state = again.state()
    assert state["epoch"] == 2
    assert (state["replay"]["adopted"], state["replay"]["discarded"]) == ([1], {})
    assert state["regions"] == sealed  # same region, same file, same seal: nothing reloaded
    wait_for(lambda: weights_origin(engine)["holder_connected"], "the engine to renew with the new holder")
    assert again.tenant("engine-a")["frozen"] is False
    assert completion_tokens(engine.url, PROMPT, MAX_TOKENS) == expected


def test_a_corrupted_region_is_discarded_never_served(fleet_factory):
    fleet = fleet_factory()
    reference = fleet.start_engine("reference")  # weights from disk
    expected = completion_tokens(reference.url, PROMPT, MAX_TOKENS)
    holder = fleet.start_holder()
    [region] = holder.state()["regions"]
    holder.kill(signal.SIGKILL)
    with open(region["path"], "r+b") as held:  # one flipped bit in lm_head, as a bad DIMM would
        held.seek(region["size"] // 2)
        byte = held.read(1)
        held.seek(-1, 1)
        held.write(bytes([byte[0] ^ 0x40]))
    ledger = holder.state_dir / "ledger.wal"
    with open(ledger, "ab") as torn:  # and a record the kill tore in half
        torn.write(b"\x40\x00\x00\x00\x12\x34\x56\x78{\"op\":\"att")

    again = fleet.start_holder(port=holder.port)
    state = again.state()
    assert state["replay"]["torn_bytes"] == 18
    assert state["replay"]["discarded"] == {"1": "checksum mismatch"}
    assert [(r["region_id"], r["status"]) for r in state["regions"]] == [(1, "freed"), (2, "sealed")]
    engine = fleet.start_engine("engine-a", ["--holder", again.url])
    assert (weights_origin(engine)["source"], weights_origin(engine)["region_id"]) == ("holder", 2)
    assert completion_tokens(engine.url, PROMPT, MAX_TOKENS) == expected


def test_a_tenant_that_shuts_down_cleanly_releases_its_lease(fleet_factory):
    fleet = fleet_factory()
    holder = fleet.start_holder()
    engine = fleet.start_engine("engine-a", ["--holder", holder.url, "--drain-unroute-wait", "0",
                                             "--drain-timeout", "0"])
    engine.kill(signal.SIGTERM)
    assert engine.process.returncode == 0
    tenant = holder.tenant("engine-a")
    assert (tenant["state"], tenant["frozen"]) == ("released", False)
    assert oneshot_http.get(f"{holder.url}/healthz/ready", timeout=5).status_code == 200


def test_every_acknowledged_attach_survives_a_holder_killed_mid_write(fleet_factory):
    """Four clients attach new tenants as fast as the holder answers; SIGKILL lands among the writes.
    The restarted holder replays a consistent prefix that holds every attach it acknowledged."""
    fleet = fleet_factory()
    holder = fleet.start_holder()
    acknowledged: list[str] = []
    stop = threading.Event()

    def client(index: int) -> None:
        with httpx.Client(timeout=5) as http:
            for n in range(100_000):
                tenant = f"t{index}-{n}"
                try:
                    response = http.post(f"{holder.url}/v1/tenants/attach", json={"tenant_id": tenant, "generation": 1})
                except httpx.HTTPError:
                    return
                if response.status_code == 200:
                    acknowledged.append(tenant)
                if stop.is_set():
                    return

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    wait_for(lambda: len(acknowledged) >= 200, "200 acknowledged attaches")
    holder.kill(signal.SIGKILL)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert holder.process.returncode == -signal.SIGKILL

    again = fleet.start_holder(port=holder.port)
    state = again.state()
    held = {t["tenant_id"] for t in state["tenants"]}
    assert set(acknowledged) <= held
    assert state["replay"]["adopted"] == [1]  # the weights region is untouched by the kill
    assert state["replay"]["records"] >= len(acknowledged) + 3  # boot, reserve, seal, then the attaches
