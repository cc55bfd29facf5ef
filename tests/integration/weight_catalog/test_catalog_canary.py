"""`lifeline catalog canary record` against real engines; the snapshot carries the record and the agent checks by it.

Three engine processes on the tiny model: two sound, one started with
`--fault-corrupt-weights` (its files, and so its weights digest, are the
catalog's; its memory is not). Both databases.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from lifeline.cli import app
from tests.support.controlplane_testing import write_artifact

VERSION = "tiny-seed0"  # the engine's served name: the tiny model's directory


@pytest.fixture(scope="module")
def engines(module_engine_factory: Any) -> dict[str, Any]:
    return {name: module_engine_factory(name, extra_args=args) for name, args in (
        ("canary-a", []), ("canary-b", []), ("canary-corrupt", ["--fault-corrupt-weights"]))}


@pytest.fixture
def lifeline(database_url: str, session_factory: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def canary_events(client: TestClient, viewer: dict[str, str]) -> list[dict[str, Any]]:
    return client.get("/api/v1/events", params={"kind": "catalog.canary.record"}, headers=viewer).json()


def test_a_canary_recorded_from_verified_instances_reaches_the_agent_through_the_snapshot(
    lifeline: Any, engines: dict[str, Any], tiny_model: Path, client: TestClient, as_role: Any, tmp_path: Path
) -> None:
    from contract.snapshot_client import SnapshotClient
    from warm_pool.agent import Agent
    from warm_pool.probe import Prober, Verdict
    from warm_pool.settings import AgentSettings

    viewer = as_role("viewer")
    sound, other, corrupt = (engines[n].url for n in ("canary-a", "canary-b", "canary-corrupt"))
    assert lifeline("catalog", "register", "tiny", VERSION, tiny_model).exit_code == 0
    assert lifeline("catalog", "promote", "tiny", "prod", VERSION).exit_code == 0
    before = client.get("/api/v1/snapshot", headers=viewer).json()["version"]

    disagree = lifeline("catalog", "canary", "record", "tiny", VERSION, "--url", sound, "--url", corrupt)
    assert disagree.exit_code == 1 and "canary_not_recorded" in disagree.output and "disagree" in disagree.output
    assert json.loads(lifeline("catalog", "show", "tiny", VERSION).output)["canary"] is None
    assert canary_events(client, viewer) == []

    recorded = lifeline("catalog", "canary", "record", "tiny", VERSION, "--url", sound, "--url", other,
                        "--prompt-token-ids", "11,12,13,14,15,16", "--max-tokens", "6", "--max-ttft-s", "30")
    assert recorded.exit_code == 0, recorded.output
    shown = json.loads(lifeline("catalog", "show", "tiny", VERSION).output)
    assert shown["canary"]["prompt_token_ids"] == [11, 12, 13, 14, 15, 16]
    assert len(shown["canary"]["output_token_ids"]) == 6 and shown["canary"]["recorded_from"] == "canary-a"
    assert shown["canary_recorded_by"].startswith("cli:")
    [event] = canary_events(client, viewer)
    assert event["after"]["recorded_from"] == ["canary-a", "canary-b"]

    snapshot = client.get("/api/v1/snapshot", headers=viewer).json()
    assert snapshot["version"] > before  # the record is in the snapshot, so it advanced
    assert snapshot["models"]["tiny"]["versions"][VERSION]["canary"] == shown["canary"]

    # The agent reads the record from the snapshot (no canary file) and checks engines by it.
    async def agent_checks() -> tuple[Any, Any, Any]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=client.app), base_url="http://cp") as cp, \
                httpx.AsyncClient(timeout=30) as engine_http:
            snapshots = SnapshotClient(cp, "http://cp", token=viewer["Authorization"].split()[1])
            await snapshots.poll()
            agent = Agent(AgentSettings(region="r1"), registry=None, http=engine_http,  # type: ignore[arg-type]
                          snapshots=snapshots)
            record = agent.canary_for(VERSION)
            assert record is not None
            prober = Prober(engine_http)
            return (record, await prober.canary(sound, model=VERSION, record=record),
                    await prober.canary(corrupt, model=VERSION, record=record))

    record, good, bad = asyncio.run(agent_checks())
    assert record.output_token_ids == shown["canary"]["output_token_ids"]
    assert good.verdict is Verdict.OK
    assert bad.verdict is Verdict.WRONG_OUTPUT and "recorded" in bad.reason

    again = lifeline("catalog", "canary", "record", "tiny", VERSION, "--url", sound)
    assert again.exit_code == 1 and "canary_exists" in again.output
    replaced = lifeline("catalog", "canary", "record", "tiny", VERSION, "--url", sound, "--replace")
    assert replaced.exit_code == 0, replaced.output
    assert json.loads(lifeline("catalog", "show", "tiny", VERSION).output)["canary"]["prompt_token_ids"] == [
        1, 2, 3, 4, 5, 6, 7, 8]
    assert len(canary_events(client, viewer)) == 2


def test_an_engine_that_is_not_a_verified_instance_records_nothing(
    lifeline: Any, engines: dict[str, Any], tmp_path: Path, client: TestClient, as_role: Any
) -> None:
    sound = engines["canary-a"].url
    # the same version name, other files: the engine's weights digest is not this entry's
    assert lifeline("catalog", "register", "impostor", VERSION, write_artifact(tmp_path / "x", seed=3)).exit_code == 0
    unverified = lifeline("catalog", "canary", "record", "impostor", VERSION, "--url", sound)
    assert unverified.exit_code == 1
    assert "canary_engine_unverified" in unverified.output and "weights digest" in unverified.output
    assert lifeline("catalog", "register", "impostor", "v2", write_artifact(tmp_path / "y", seed=4)).exit_code == 0
    other_version = lifeline("catalog", "canary", "record", "impostor", "v2", "--url", sound)
    assert other_version.exit_code == 1 and f"serves '{VERSION}'" in other_version.output
    missing = lifeline("catalog", "canary", "record", "impostor", "v9", "--url", sound)
    assert missing.exit_code == 1 and "version_not_found" in missing.output
    nobody = lifeline("catalog", "canary", "record", "impostor", VERSION, "--url", "http://127.0.0.1:9")
    assert nobody.exit_code == 1 and "canary_not_recorded" in nobody.output
    for args in (("--prompt-token-ids", "a,b"), ("--prompt-token-ids", ""), ("--max-tokens", "0")):
        bad = lifeline("catalog", "canary", "record", "impostor", VERSION, "--url", sound, *args)
        assert bad.exit_code == 2, (args, bad.output)
    for version in (VERSION, "v2"):
        assert json.loads(lifeline("catalog", "show", "impostor", version).output)["canary"] is None
    assert canary_events(client, as_role("viewer")) == []


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_canary_migration_goes_down_and_up(backend: str, tmp_path: Path) -> None:
    from sqlalchemy import inspect

    from controlplane.db import build_engine
    from controlplane.schema import downgrade, upgrade
    from tests.support.controlplane_testing import throwaway_database

    with throwaway_database(backend, tmp_path) as url:
        upgrade(url, "0013")
        engine = build_engine(url)
        try:
            def columns() -> set[str]:
                with engine.connect() as conn:
                    return {c["name"] for c in inspect(conn).get_columns("weight_versions")}

            assert {"canary", "canary_recorded_at", "canary_recorded_by"} <= columns()
            downgrade(url, "0012")
            assert not {"canary", "canary_recorded_at", "canary_recorded_by"} & columns()
            assert "last_verify_healthy" in columns()
            upgrade(url, "0013")
            assert {"canary", "canary_recorded_at", "canary_recorded_by"} <= columns()
        finally:
            engine.dispose()
