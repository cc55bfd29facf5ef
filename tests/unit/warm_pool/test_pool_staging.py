"""A cold-tier pool's staged artifacts, checked against the catalog's checksums on the snapshot (warm_pool/staging.py)."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from pathlib import Path

import httpx

from common.clock import ManualClock
from contract.identity import weights_digest
from contract.snapshot import RoutingSnapshot, VersionEntry
from tests.unit.warm_pool.test_pool_agent import Fleet, make_agent, settle
from warm_pool.report import ReportSender
from warm_pool.staging import check_staged
from warm_pool.states import InstanceState

# a small two-zone plan (tests/unit/warm_pool/test_pool_plan_settings.py's)
PLAN_INPUTS = {"zones": ["x", "y"], "demand_seqs": 6, "demand_tokens_per_s": 150, "context_tokens": 40,
               "instance_seqs": 4, "instance_tokens_per_s": 100, "instance_prefill_tokens_per_s": 1000,
               "recovery_target_s": 5.0}
FILES = {"model-00001-of-00002.safetensors": b"\x01" * 4096, "model-00002-of-00002.safetensors": b"\x02" * 1000,
         "config.json": b'{"max_position_embeddings": 64}'}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def stage(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in FILES.items():
        (directory / name).write_bytes(data)
    return directory


def entry(*, shards: bool = True) -> VersionEntry:
    recorded = {name: sha(data) for name, data in FILES.items()}
    return VersionEntry(version="v1", fingerprint="f", location="s3://bucket/m/v1", weights_digest=weights_digest(recorded),
                        files={"config.json": recorded["config.json"]}, shards=recorded if shards else {})


def test_every_recorded_shard_present_with_its_sha256_is_verified(tmp_path: Path) -> None:
    result = check_staged(entry(), stage(tmp_path / "v1"))
    assert (result.outcome, result.shard) == ("verified", None)
    assert "3 files" in result.reason


def test_an_absent_shard_is_missing_and_named(tmp_path: Path) -> None:
    directory = stage(tmp_path / "v1")
    (directory / "model-00002-of-00002.safetensors").unlink()
    result = check_staged(entry(), directory)
    assert (result.outcome, result.shard) == ("missing", "model-00002-of-00002.safetensors")


def test_a_directory_never_staged_is_missing(tmp_path: Path) -> None:
    result = check_staged(entry(), tmp_path / "nowhere")
    assert result.outcome == "missing" and "nowhere" in result.reason


def test_a_shard_whose_sha256_differs_is_a_mismatch_naming_it(tmp_path: Path) -> None:
    directory = stage(tmp_path / "v1")
    shard = directory / "model-00001-of-00002.safetensors"
    shard.write_bytes(b"\x01" * 4095 + b"\x00")  # same size, one byte flipped
    result = check_staged(entry(), directory)
    assert (result.outcome, result.shard) == ("mismatch", "model-00001-of-00002.safetensors")
    assert sha(shard.read_bytes())[:16] in result.reason


def test_without_shards_on_the_snapshot_the_weights_digest_decides(tmp_path: Path) -> None:
    """A control plane older than VersionEntry.shards: the gateway files by name, the weights as one digest."""
    directory = stage(tmp_path / "v1")
    assert check_staged(entry(shards=False), directory).outcome == "verified"
    (directory / "model-00002-of-00002.safetensors").write_bytes(b"\x00")
    result = check_staged(entry(shards=False), directory)
    assert (result.outcome, result.shard) == ("mismatch", None) and "weights_digest" in result.reason


def test_a_recorded_path_outside_the_directory_is_never_read(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"x")
    bad = entry().model_copy(update={"shards": {"../secret": sha(b"x")}})
    result = check_staged(bad, stage(tmp_path / "v1"))
    assert (result.outcome, result.shard) == ("mismatch", "../secret")


def snapshot_for(directory: Path) -> RoutingSnapshot:
    return RoutingSnapshot(version=1, models={"m": {"aliases": {"prod": {"version": "v1", "revision": 1}},
                                                    "versions": {"v1": entry().model_copy(
                                                        update={"location": str(directory)})}}})


async def test_a_cold_pool_checks_at_start_up_then_every_interval_one_event_per_change(tmp_path: Path) -> None:
    clock, fleet = ManualClock(), Fleet()
    directory = stage(tmp_path / "v1")
    agent, _, shipper = make_agent(fleet, clock, pool={
        "model": "m", "versions": {"v1": str(directory)}, "state_dir": str(tmp_path),
        "staging_check_every": 60, "plan": {**PLAN_INPUTS, "tier": "cold"}})

    class Snapshots:
        current = snapshot_for(directory)

    agent.snapshots = Snapshots()  # type: ignore[assignment]

    async def tick() -> None:
        await settle(agent, clock)
        await agent.staging.wait()

    def staging_events() -> list[tuple[str, str | None]]:
        return [(e.detail["outcome"], e.detail["shard"]) for e in shipper.buffer if e.kind == "pool.staging"]

    def gauge() -> float:
        return agent.metrics.registry.get_sample_value("lifeline_agent_staged_version_verified", {"version": "v1"})

    await tick()
    [staged] = agent.report().staging
    assert (staged.model, staged.version, staged.outcome, staged.directory) == ("m", "v1", "verified", str(directory))
    assert staging_events() == [("verified", None)] and gauge() == 1.0

    (directory / "config.json").write_bytes(b"{}")
    await tick()  # within the interval: not hashed again
    assert agent.report().staging[0].outcome == "verified"
    clock.advance(60)
    await tick()
    assert agent.report().staging[0].outcome == "mismatch" and gauge() == 0.0
    clock.advance(60)
    await tick()  # the same outcome again: no second event
    assert staging_events() == [("verified", None), ("mismatch", "config.json")]
    assert [e.instance_id for e in shipper.buffer if e.kind == "pool.staging"] == [None, None]


async def test_a_warm_pool_checks_nothing_and_its_report_has_no_staging_key(tmp_path: Path) -> None:
    """An agent without a cold pool sends the report an older control plane (extra fields forbidden) takes."""
    clock, fleet = ManualClock(), Fleet()
    agent, _, _ = make_agent(fleet, clock, pool={
        "model": "m", "versions": {"v1": str(tmp_path)}, "state_dir": str(tmp_path),
        "plan": {**PLAN_INPUTS, "tier": "warm"}})
    await settle(agent, clock)
    assert agent.staging is None and agent.report().staging is None
    sent: list[bytes] = []

    def control_plane(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(200)

    async with httpx.AsyncClient(transport=httpx.MockTransport(control_plane)) as http:
        assert await ReportSender(http, "http://cp").send(agent.report()) == "sent"
    assert "staging" not in json.loads(sent[0])


def test_the_check_interval_is_a_typed_setting(tmp_path: Path) -> None:
    from warm_pool.settings import PoolSettings

    settings = PoolSettings(model="m", versions={"v1": tmp_path}, state_dir=tmp_path)
    assert settings.staging_check_every == timedelta(minutes=10)


def serving_snapshot(directory: Path) -> RoutingSnapshot:
    """snapshot_for's, with the weights digest the scripted engines report: their instances pass the probe."""
    snapshot = snapshot_for(directory)
    model = snapshot.models["m"]
    entry = model.versions["v1"].model_copy(update={"weights_digest": "sha256:x"})
    return snapshot.model_copy(update={"models": {"m": model.model_copy(update={"versions": {"v1": entry}})}})


def resync(path: Path, data: bytes) -> None:
    """Put the catalog's bytes back as a re-sync does: written beside, renamed over."""
    fresh = path.with_name(path.name + ".partial")
    fresh.write_bytes(data)
    fresh.replace(path)


async def test_a_cold_pool_never_starts_a_version_found_bad_and_starts_it_once_the_file_is_fixed(tmp_path: Path) -> None:
    """Unchecked, a loss-driven start proceeds; found mismatch, the replacement is held and said so; fixed, it starts."""
    clock, fleet = ManualClock(), Fleet()
    directory = stage(tmp_path / "v1")
    shard = directory / "model-00001-of-00002.safetensors"
    shard.write_bytes(b"\x01" * 4095 + b"\x00")  # bad on the region's disk before the agent ever looked
    agent, _, shipper = make_agent(fleet, clock, pool={
        "model": "m", "versions": {"v1": str(directory)}, "state_dir": str(tmp_path),
        "staging_check_every": 600, "plan": {**PLAN_INPUTS, "tier": "cold"}})

    class Snapshots:
        current = serving_snapshot(directory)

    agent.snapshots = Snapshots()  # type: ignore[assignment]

    async def tick(ticks: int = 1) -> None:
        for _ in range(ticks):
            await settle(agent, clock)
            await agent.staging.wait()

    def held() -> float:
        return agent.metrics.registry.get_sample_value("lifeline_agent_pool_held_starts", {"version": "v1"})

    await tick(4)  # the first fill ran before the first check finished: not delayed for it
    assert len(agent.driver.started) == 2
    assert agent.report().staging[0].outcome == "mismatch"
    serving = {i.zone: i.instance_id for i in agent.instances.values() if i.state is InstanceState.SERVING}
    assert set(serving) == {"x", "y"}

    fleet.engines[serving["x"]].live = False  # a loss: x needs a new instance of v1
    await tick(6)
    assert len(agent.driver.started) == 2  # never loaded from the bad copy
    assert not [i for i in agent.instances.values() if i.zone == "x"]
    [refused] = [e for e in shipper.buffer if e.kind == "pool.start_refused"]  # one per hold, not one per tick
    assert (refused.detail["version"], refused.detail["outcome"], refused.detail["shard"], refused.detail["held"],
            refused.detail["zones"]) == ("v1", "mismatch", shard.name, 1, "x")
    assert refused.instance_id is None and "nothing started in its place" in refused.reason
    [staged] = agent.report().staging
    assert (staged.outcome, staged.shard, staged.held_starts) == ("mismatch", shard.name, 1)
    assert held() == 1

    resync(shard, FILES[shard.name])
    await tick()  # the file changed: checked again at once, not at the 10-minute interval
    assert agent.report().staging[0].outcome == "verified"
    await tick(3)
    assert len(agent.driver.started) == 3 and agent.driver.started[-1].zone == "x"
    assert agent.report().staging[0].held_starts == 0 and held() == 0
    assert [e.detail["outcome"] for e in shipper.buffer if e.kind == "pool.staging"] == ["mismatch", "verified"]
    assert len([e for e in shipper.buffer if e.kind == "pool.start_refused"]) == 1


async def test_a_result_against_an_older_catalog_record_refuses_nothing(tmp_path: Path) -> None:
    clock, fleet = ManualClock(), Fleet()
    directory = stage(tmp_path / "v1")
    (directory / "config.json").write_bytes(b"{}")
    agent, _, _ = make_agent(fleet, clock, pool={
        "model": "m", "versions": {"v1": str(directory)}, "state_dir": str(tmp_path),
        "plan": {**PLAN_INPUTS, "tier": "cold"}})
    snapshot = snapshot_for(directory)
    agent.staging.start(snapshot)
    await agent.staging.wait()
    assert agent.staging.refusal("v1", snapshot).outcome == "mismatch"
    entry = snapshot.models["m"].versions["v1"]
    recorded = entry.model_copy(update={"shards": {**entry.shards, "config.json": sha(b"{}")}})
    newer = snapshot.model_copy(update={"models": {"m": snapshot.models["m"].model_copy(
        update={"versions": {"v1": recorded}})}})
    assert agent.staging.refusal("v1", newer) is None  # unknown against the new record until checked again


async def test_an_alias_moved_to_a_bad_copy_starts_nothing_of_it_and_the_old_serving_set_keeps_its_leases(
        tmp_path: Path) -> None:
    clock, fleet = ManualClock(), Fleet()
    good, bad = stage(tmp_path / "v1"), stage(tmp_path / "v2")
    (bad / "model-00002-of-00002.safetensors").unlink()
    agent, registry, shipper = make_agent(fleet, clock, pool={
        "model": "m", "versions": {"v1": str(good), "v2": str(bad)}, "state_dir": str(tmp_path),
        "old_generation_grace": 3, "plan": {**PLAN_INPUTS, "tier": "cold"}})
    agent.canary_records["v2"] = agent.canary_records["v1"]
    snapshot = serving_snapshot(good)
    model = snapshot.models["m"]
    entries = {"v1": model.versions["v1"], "v2": model.versions["v1"].model_copy(update={"version": "v2"})}

    class Snapshots:
        current = snapshot.model_copy(update={"models": {"m": model.model_copy(update={"versions": entries})}})

    agent.snapshots = Snapshots()  # type: ignore[assignment]

    async def tick(ticks: int = 1) -> None:
        for _ in range(ticks):
            await settle(agent, clock)
            await agent.staging.wait()

    await tick(4)
    assert {s.version: s.outcome for s in agent.report().staging} == {"v1": "verified", "v2": "missing"}
    v1 = {lease.instance_id for lease in await registry.live()}
    assert len(v1) == 2

    moved = Snapshots.current.model_dump()
    moved["models"]["m"]["aliases"]["prod"] = {"version": "v2", "revision": 2}
    Snapshots.current = RoutingSnapshot.model_validate(moved)
    await tick(20)  # 10 s: long past the grace
    assert {s.version for s in agent.driver.started} == {"v1"}  # nothing of v2 was loaded
    assert {lease.instance_id for lease in await registry.live()} == v1  # old_generation: established ones finish
    assert {s.version: s.held_starts for s in agent.report().staging} == {"v1": 0, "v2": 2}
    [refused] = [e for e in shipper.buffer if e.kind == "pool.start_refused"]
    assert (refused.detail["version"], refused.detail["outcome"], refused.detail["zones"]) == ("v2", "missing", "x,y")
