"""`lifeline cutover …` and `lifeline zonal-shift …` through their typer apps, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from controlplane.db import session_scope
from controlplane.topology import service as topology
from cutover.cli import cutover_app, zonal_shift_app
from tests.integration.cutover.test_cutover_support import (  # noqa: F401 - fixtures
    topology_two_regions,
)

pytestmark = pytest.mark.usefixtures("topology_two_regions")


@pytest.fixture
def cli(database_url: str, session_factory: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    runner = CliRunner()

    def run(app: Any, *args: str) -> Any:
        return runner.invoke(app, list(args), catch_exceptions=False)

    return run


def cluster_states(session_factory: Any) -> dict[str, str]:
    with session_scope(session_factory) as session:
        return {c.name: c.state for c in topology.list_clusters(session)}


def test_plan_execute_show_list_rollback(cli: Any, session_factory: Any) -> None:
    planned = cli(cutover_app, "plan", "--region", "eu", "--zone", "eu-a", "--reason", "eu-a flaky", "--json")
    assert planned.exit_code == 0, planned.output
    cutover_id = json.loads(planned.output)["id"]
    assert cluster_states(session_factory)["c-eu-a"] == "active"

    done = cli(cutover_app, "execute", str(cutover_id), "--key", "cli-1")
    assert done.exit_code == 0, done.output
    assert "completed" in done.output and "[verified]" in done.output
    assert cluster_states(session_factory)["c-eu-a"] == "draining"
    again = cli(cutover_app, "execute", str(cutover_id), "--key", "cli-1", "--json")
    assert json.loads(again.output)["state"] == "completed"

    shown = json.loads(cli(cutover_app, "show", str(cutover_id)).output)
    assert shown["steps"][0]["actual_before"]["state"] == "active"
    assert f"#{cutover_id}" in cli(cutover_app, "list", "--state", "completed").output
    assert cli(cutover_app, "list", "--state", "sideways").exit_code == 2

    back = cli(cutover_app, "rollback", str(cutover_id), "--reason", "better now")
    assert back.exit_code == 0 and "rolled_back" in back.output
    assert cluster_states(session_factory)["c-eu-a"] == "active"


def test_refusals_exit_1_with_the_error_type(cli: Any) -> None:
    missing = cli(cutover_app, "show", "404")
    assert missing.exit_code == 1 and "cutover_not_found" in missing.output
    assert cli(cutover_app, "gate", "--stop", "--reason", "freeze").exit_code == 0
    cutover_id = json.loads(cli(cutover_app, "plan", "--region", "us", "--reason", "x", "--json").output)["id"]
    refused = cli(cutover_app, "execute", str(cutover_id))
    assert refused.exit_code == 1 and "safety_rule_violation" in refused.output
    assert cli(cutover_app, "gate", "--release", "--reason", "thaw").exit_code == 0


def test_zonal_shift_start_list_cancel(cli: Any, session_factory: Any) -> None:
    too_long = cli(zonal_shift_app, "start", "eu", "eu-b", "--expires-in", "73h", "--reason", "x")
    assert too_long.exit_code == 1 and "invalid_expiry" in too_long.output
    assert cli(zonal_shift_app, "start", "eu", "eu-b", "--expires-in", "soon", "--reason", "x").exit_code == 2
    started = cli(zonal_shift_app, "start", "eu", "eu-b", "--expires-in", "90m", "--reason", "eu-b loss")
    assert started.exit_code == 0, started.output
    assert cluster_states(session_factory)["c-eu-b"] == "draining"
    (row,) = json.loads(cli(zonal_shift_app, "list", "--active", "--json").output)
    assert (row["zone"], row["active"]) == ("eu-b", True)
    cancelled = cli(zonal_shift_app, "cancel", str(row["id"]), "--reason", "fixed")
    assert cancelled.exit_code == 0, cancelled.output
    assert cluster_states(session_factory)["c-eu-b"] == "active"
    assert json.loads(cli(zonal_shift_app, "list", "--active", "--json").output) == []


def test_cli_drives_the_configured_tiers_so_it_can_roll_them_back_without_the_api(
        cli: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, bind_server: Any) -> None:
    import dns.message
    import dns.query

    from tests.integration.cutover.conftest import REGION_A, REGION_B, dns_drivers_table

    def answer() -> list[str]:
        response = dns.query.udp(dns.message.make_query(f"api.{bind_server.zone}", "A"), bind_server.host,
                                 port=bind_server.port, timeout=2)
        return sorted(r.address for rrset in response.answer for r in rrset)

    drivers = tmp_path / "drivers.toml"
    drivers.write_text(dns_drivers_table(bind_server, tmp_path))
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE", str(drivers))
    planned = cli(cutover_app, "plan", "--region", "eu", "--tier", "dns", "--reason", "eu lost", "--json")
    assert planned.exit_code == 0, planned.output
    cutover_id = json.loads(planned.output)["id"]
    assert cli(cutover_app, "execute", str(cutover_id)).exit_code == 0
    assert answer() == [REGION_B]
    assert cli(cutover_app, "rollback", str(cutover_id), "--reason", "eu back").exit_code == 0
    assert answer() == [REGION_A]
