"""SLO documents: no figure without evidence, on SQLite and PostgreSQL, through the API and the CLI."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from typer.testing import CliRunner

from controlplane.db import session_scope
from controlplane.drill import service
from controlplane.drill.cli import drill_app
from controlplane.drill.schemas import DrillSpec
from controlplane.drill.states import DrillRunEvent
from controlplane.slo import triple
from controlplane.slo.cli import slo_app

SPEC = {"name": "kill-one", "model": "tiny", "scope": "instance", "fault": "sigkill",
        "blast_radius": {"region": "local", "instances": ["victim"]},
        "targets": {"rto_quality_s": 30.0, "request_rto_s": 2.0, "token_rpo_tokens": 0}}


def ended_run(session_factory, clock, *, state: str, measured: dict[str, float]) -> int:
    """A run of the defined drill that ended in `state` with `measured` in its report."""
    with session_scope(session_factory) as session:
        definition = service.get_definition_or_raise(session, name=SPEC["name"])
        run = service.create_run(session, definition=definition, trigger="manual", actor="t", clock=clock)
        if state == "aborted":
            return service.abort(session, run_id=run.id, reason="stop", actor="t", clock=clock).id
        run = service.start(session, run_id=run.id, fault_target="victim", actor="t", clock=clock)
        run = service.advance(session, run=run, event=DrillRunEvent.FAULT_CLEARED, clock=clock)
        event = DrillRunEvent.PASS if state == "passed" else DrillRunEvent.FAIL
        return service.advance(session, run=run, event=event, clock=clock, report={"measured": measured}).id


def figures(client, as_role) -> dict[str, dict[str, Any]]:
    response = client.get("/api/v1/slo/tiny", headers=as_role("viewer"))
    assert response.status_code == 200, response.text
    return {f["metric"]: f for entry in response.json()["triple"] for f in entry["figures"]}


def verdicts(client, as_role) -> dict[str, tuple[float, float | None]]:
    """metric → (target_verified, measured) of model tiny on /metrics; each agrees with the document's figure."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, s.labels["metric"]): s.value for family in text_string_to_metric_families(
        client.get("/metrics").text) for s in family.samples
        if s.name.startswith("lifeline_controlplane_slo_") and s.labels.get("model") == "tiny"}
    shown = {metric: (value, samples.get(("lifeline_controlplane_slo_measured", metric)))
             for (name, metric), value in samples.items() if name == "lifeline_controlplane_slo_target_verified"}
    declared = {m: f for m, f in figures(client, as_role).items() if f["target"] is not None}
    assert set(shown) == set(declared)
    assert all(shown[m][0] == (declared[m]["status"] == "measured") for m in shown), (shown, declared)
    return shown


def test_without_drills_every_target_is_unverified(client, as_role):
    document = client.get("/api/v1/slo/tiny", headers=as_role("viewer")).json()
    assert [e["dimension"] for e in document["triple"]] == ["W", "K", "C"]
    assert {f["status"] for e in document["triple"] for f in e["figures"]} == {"unverified"}


def test_a_target_is_measured_only_by_a_fresh_passed_run(client, as_role, session_factory, clock):
    with session_scope(session_factory) as session:
        service.define(session, spec=DrillSpec.model_validate(SPEC), actor="t", clock=clock)
    assert figures(client, as_role)["rto_quality_s"]["why"] == "never drilled"
    assert verdicts(client, as_role)["rto_quality_s"] == (0, None)  # what LifelineSloTargetUnverified reads

    failed = ended_run(session_factory, clock, state="failed", measured={"rto_quality_s": 50.0})
    quality = figures(client, as_role)["rto_quality_s"]
    assert (quality["status"], quality["run_id"]) == ("unverified", failed)
    assert "failed" in quality["why"]
    assert verdicts(client, as_role)["rto_quality_s"][0] == 0

    aborted = ended_run(session_factory, clock, state="aborted", measured={})
    assert figures(client, as_role)["rto_quality_s"]["run_id"] == aborted

    passed = ended_run(session_factory, clock, state="passed",
                       measured={"rto_quality_s": 6.5, "request_rto_s": 0.2, "token_rpo_tokens": 0.0})
    now = figures(client, as_role)
    assert (now["rto_quality_s"]["status"], now["rto_quality_s"]["measured"], now["rto_quality_s"]["run_id"]) == (
        "measured", 6.5, passed)
    assert now["token_rpo_tokens"]["status"] == "measured"
    assert now["rpo_context_tokens"]["status"] == "unverified"  # no drill declares it
    assert now["rto_latency_s"]["why"] == "no drill declares a target for it"
    assert verdicts(client, as_role)["rto_quality_s"] == (1, 6.5)

    clock.advance(timedelta(days=7, seconds=1))  # older than the weekly cadence
    stale = figures(client, as_role)["rto_quality_s"]
    assert stale["status"] == "unverified" and "older than its cadence (7 days)" in stale["why"]
    assert verdicts(client, as_role)["rto_quality_s"][0] == 0


def test_markdown_and_html_say_unverified_never_met(client, as_role, session_factory, clock):
    with session_scope(session_factory) as session:
        service.define(session, spec=DrillSpec.model_validate(SPEC), actor="t", clock=clock)
    md = client.get("/api/v1/slo/tiny", params={"format": "md"}, headers=as_role("viewer"))
    assert md.headers["content-type"].startswith("text/markdown")
    assert "| RTO_quality: fault → canary passes on every serving instance | 30 s | *unverified* (never drilled) |" \
        in md.text
    html = client.get("/api/v1/slo/tiny", params={"format": "html"}, headers=as_role("viewer"))
    assert "<em>unverified</em> (never drilled)" in html.text and "→" in html.text
    assert client.get("/api/v1/slo/tiny", params={"format": "pdf"}, headers=as_role("viewer")).status_code == 422


def test_cli_defines_runs_approves_aborts_and_exports(database_url, session_factory, monkeypatch, tmp_path):
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    runner = CliRunner()

    def cli(app, *args):
        return runner.invoke(app, list(args), catch_exceptions=False)

    spec_file = tmp_path / "zone.yaml"
    spec_file.write_text(json.dumps({"name": "lose-a", "model": "tiny", "scope": "zone", "fault": "zone_loss",
                                     "blast_radius": {"region": "local", "zones": ["local-a"]}}))
    defined = cli(drill_app, "define", str(spec_file))
    assert defined.exit_code == 0, defined.output
    assert json.loads(defined.output)["version"] == 1
    requested = cli(drill_app, "run", "lose-a")
    assert requested.exit_code == 0 and "awaiting_approval" in requested.output, requested.output
    run_id = requested.output.split()[1].rstrip(":")
    assert "scheduled" in cli(drill_app, "approve", run_id).output
    assert "aborted" in cli(drill_app, "abort", run_id, "--reason", "freeze").output
    shown = json.loads(cli(drill_app, "show", run_id).output)
    assert shown["approved_by"].startswith("cli:") and shown["abort_reason"] == "freeze"
    refused = cli(drill_app, "approve", run_id)
    assert refused.exit_code == 1
    exported = cli(slo_app, "export", "--model", "tiny", "--format", "json")
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.output)["model"] == "tiny"
    assert "*unverified*" in cli(slo_app, "export", "--model", "tiny").output


def test_cli_executes_an_approved_region_run_and_refuses_it_typed_without_a_second_region(
        database_url, session_factory, monkeypatch, tmp_path):
    import yaml

    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    runner = CliRunner()

    def cli(*args):
        return runner.invoke(drill_app, list(args), catch_exceptions=False)

    spec_file = tmp_path / "region.yaml"
    spec_file.write_text(json.dumps({"name": "lose-region", "model": "tiny", "scope": "region",
                                     "fault": "region_loss", "blast_radius": {"region": "local"},
                                     "expected_tier": "dns"}))
    fleet_file = tmp_path / "fleet.yaml"  # one region, no dns tier: the local fleet as it is
    fleet_file.write_text(yaml.safe_dump({"gateway_url": "http://127.0.0.1:9", "region": "local", "instances": {
        "eng-0": {"url": "http://127.0.0.1:9", "served_model": "tiny", "zone": "local-a"}}}))
    assert cli("define", str(spec_file)).exit_code == 0
    run_id = cli("run", "lose-region").output.split()[1].rstrip(":")
    unapproved = cli("run", "lose-region", "--run", run_id, "--fleet", str(fleet_file))
    assert unapproved.exit_code == 1 and "approval_required" in unapproved.output, unapproved.output
    assert cli("run", "other-name", "--run", run_id, "--fleet", str(fleet_file)).exit_code == 2
    assert cli("run", "lose-region", "--run", run_id).exit_code == 2  # --run needs --fleet
    cli("approve", run_id)
    refused = cli("run", "lose-region", "--run", run_id, "--fleet", str(fleet_file))
    assert refused.exit_code == 1 and "error: region_tier_not_wired:" in refused.output, refused.output
    shown = json.loads(cli("show", run_id).output)
    assert shown["state"] == "aborted" and "no dns tier" in shown["abort_reason"] and shown["started_at"] is None


def test_lost_kept_and_recovery_come_from_the_runs_the_engines_and_the_policies(client, as_role, session_factory,
                                                                                 clock):
    """No constant text: region streams end with the region; seeded identity only where the engine samples so."""
    viewer, op = as_role("viewer"), as_role("operator")
    document = client.get("/api/v1/slo/tiny", headers=viewer).json()
    k, c = document["triple"][1], document["triple"][2]
    assert "region: streams in flight at the region's gateways end with the region" in k["recovery"]
    assert "never drilled: unverified" in k["recovery"]
    assert document["continuation"]["verified"] is False and document["engine"]["run_id"] is None
    assert document["rpo_context_policies"] == []

    assert client.put("/api/v1/replication/policies", headers=op, json={
        "model": "tiny", "session_class": "chat", "mode": "critical", "rpo_context_seconds": 30,
        "source_store": "file:///var/kv/a", "destination_store": "file:///var/kv/b", "retention_seconds": 3600,
        "reason": "standby"}).status_code == 200
    with session_scope(session_factory) as session:
        service.define(session, spec=DrillSpec.model_validate(SPEC), actor="t", clock=clock)
    run_id = ended_run(session_factory, clock, state="passed", measured={"requests_lost": 0.0,
                                                                        "token_rpo_tokens": 0.0})
    with session_scope(session_factory) as session:  # the runner's report also names the engines it saw
        run = service.get_run_or_raise(session, run_id=run_id)
        run.report = {**run.report, "migrated_streams": 2,
                      "engines": {"engines": ["vllm"], "sampling": "engine_default", "instances": {}}}
    document = client.get("/api/v1/slo/tiny", headers=viewer).json()
    k, c = document["triple"][1], document["triple"][2]
    assert "instance: streams in flight on the lost instance continue on another" in k["recovery"]
    assert f"(run {run_id}: 2 streams migrated, 0 requests lost, token RPO 0)" in k["recovery"]
    assert "chat: at most 30 s of context without a checkpoint at the standby (critical)" in k["kept"]
    assert document["rpo_context_policies"][0]["session_class"] == "chat"
    assert document["continuation"]["greedy"] == "token-identical on the same weights"
    assert document["continuation"]["seeded"].startswith(f"{triple.SEEDED_WITHOUT_SAMPLER} (vLLM without")
    assert f"seeded: {triple.SEEDED_WITHOUT_SAMPLER}" in c["kept"]
    md = client.get("/api/v1/slo/tiny", params={"format": "md"}, headers=viewer).text
    assert "## RPO_context declared per session class" in md and "| chat | critical |" in md
    assert f"Engines: vllm, sampling engine_default (drill run {run_id})." in md
    html = client.get("/api/v1/slo/tiny", params={"format": "html"}, headers=viewer).text
    assert "RPO_context declared per session class" in html and "lifeline_vllm" in html
