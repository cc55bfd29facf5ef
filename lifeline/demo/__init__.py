"""`lifeline demo`: Lifeline's promises on a small real fleet, on the embedded default.

It builds the tiny model, starts the control plane (`lifeline controlplane
serve`, SQLite in the work dir), registers the model in its weight catalog
and promotes it to `prod`, and declares two regions of two zones each. Each
region gets a gateway that routes by the control plane's snapshot (a
`gateway`-role token) and one engine per zone; `lifeline pool plan` says
what the warm pool should be, and the demo says what it runs instead. It
prints the snapshot version each gateway reports having applied (GET
/api/v1/gateways), streams a greedy completion undisturbed at both regions,
then again while SIGKILLing the engine serving it: the client's tokens must
equal the undisturbed run's, with contiguous sequence numbers and one
migration. The killed engine restarts under a higher generation. Then a
zonal shift (POST /api/v1/zonal-shifts) takes that engine's zone out of
routing under steady traffic, which the other zone serves alone, lists the
shift's `routing_tier` events and cancels it; and an instance drill requested
through the drill API (run in-process by the control plane on the fleet file
the demo writes) SIGKILLs an engine under traffic, writes its report and
turns the SLO document's request RTO from `unverified` to `measured`. The
last line says which routing tiers acted for real.

Every process is real and is stopped on exit (also on failure and Ctrl-C);
logs stay in the work dir. docs/demo.md says what each part proves.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from lifeline.demo.fleet import MODEL, DemoFleet
from lifeline.demo.scenarios import (
    engine_kill,
    instance_drill,
    mark,
    restart,
    snapshot_line,
    stream,
    tiers_line,
    zonal_shift,
)

console = Console(highlight=False)

REGIONS = {"eu-west": ("eu-west-a", "eu-west-b"), "us-east": ("us-east-a", "us-east-b")}
# The demand the capacity plan is asked about: a small steady load the tiny model serves on one core.
PLAN_ARGS = ["--demand-seqs", "6", "--demand-tokens-per-s", "150", "--context-tokens", "40", "--instance-seqs", "4",
             "--instance-tokens-per-s", "100", "--instance-prefill-tokens-per-s", "1000", "--headroom", "1.0",
             "--recovery-target-s", "5"]

def demo(
    workdir: Annotated[Path, typer.Option(help="Model, database, configs, reports and logs go here")] = Path(
        ".lifeline/demo"),
    max_tokens: Annotated[int, typer.Option(min=8, max=1024, help="Tokens per stream")] = 64,
    kill_after: Annotated[int, typer.Option(min=1, help="SIGKILL the serving engine after this many tokens")] = 20,
) -> None:
    """Two regions on real processes: an engine killed mid-stream, a zone shifted out, a drill measured."""
    from engine.model_build import build_model

    if kill_after >= max_tokens:
        raise typer.BadParameter("must be below --max-tokens", param_hint="--kill-after")
    began = time.monotonic()
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    console.print("[bold]Lifeline demo[/] — embedded default: a served SQLite control plane, gateways routing by "
                  "its snapshot, reference engines in two regions × two zones")

    model_dir = workdir / "models" / "tiny-seed0"
    if not (model_dir / "model.safetensors.index.json").exists():
        with console.status("building the tiny model …"):
            build_model(model_dir, preset_name="tiny", seed=0)
    console.print(f"[1/9] model     tiny-seed0 in {model_dir}")

    fleet = DemoFleet(workdir, model_dir)
    try:
        with console.status("starting the control plane, registering the model …"):
            version = fleet.start_controlplane()
        console.print(f"[2/9] catalog   {MODEL}/{version['version']}: {len(version['shards'])} files hashed (sha256), "
                      f"semantic fingerprint {version['fingerprint'][:16]}…, alias prod → {version['version']}; "
                      f"control plane at {fleet.controlplane.url}")

        plan = fleet.pool_plan(next(iter(REGIONS)), next(iter(REGIONS.values())), PLAN_ARGS)
        planned = ", ".join(f"{z['zone']} {z['serving']} serving + {z['warm']} warm" for z in plan["zones"])
        with console.status("starting a gateway per region and one engine per zone …"):
            for name, zones in REGIONS.items():
                region = fleet.start_region(name, zones)
                for zone in zones:
                    fleet.add_engine(region, zone, f"{zone}-0")
            fleet.wait_serving()
        console.print(f"[3/9] serving   {len(REGIONS)} regions × 2 zones; `lifeline pool plan` asks per region: {planned}; "
                      "the demo runs 1 serving engine per zone and no warm pool (the regional agent that keeps it "
                      "needs a Redis lease registry, which the embedded default has not)")
        for region in fleet.regions.values():
            console.print(f"              {region.name}: gateway {region.gateway.url}, leases {region.gateway.leases()}")
        console.print(f"[4/9] snapshot  {snapshot_line(fleet)}")

        region = fleet.regions["eu-west"]
        victim, survivor = region.engine("eu-west-a-0"), region.engine("eu-west-b-0")
        reference = stream(region.gateway.url, max_tokens=max_tokens, prefer=survivor.instance_id)
        other = stream(fleet.regions["us-east"].gateway.url, max_tokens=max_tokens)
        same = other.token_ids == reference.token_ids
        console.print(f"[5/9] reference {len(reference.token_ids)} tokens, undisturbed, at both regions' gateways; "
                      f"identical across regions: {mark(same)}: {reference.text[:60]!r}…")

        killed = engine_kill(region, victim, reference, max_tokens=max_tokens, kill_after=kill_after)
        console.print(f"[6/9] fault     {killed.line}")

        with console.status(f"restarting {victim.instance_id} …"):
            before, after = restart(region, victim)
        console.print(f"[7/9] restart   {victim.instance_id} is back under generation {after} (was {before}); "
                      "frames of the old generation are refused")
        with console.status(f"shifting {victim.zone} out of routing under steady traffic …"):
            shifted = zonal_shift(fleet, region, victim.zone)
        console.print(f"[8/9] zone      {shifted.line}")
        with console.status("running an instance drill through the drill API …"):
            drilled = instance_drill(fleet, region, victim)
        console.print(f"[9/9] drill     {drilled.line}")
        console.print(f"tiers           {tiers_line()}")
        if not (killed.ok and same and shifted.ok and drilled.ok):
            console.print(f"[red]a promise was broken (see the lines above); logs in {fleet.logs}[/]")
            raise typer.Exit(1)
        console.print(f"[green]done[/] in {time.monotonic() - began:.0f} s: every stream unbroken and "
                      f"token-identical, the zone shifted and back, the drill passed and measured. Reports: "
                      f"{workdir / 'reports'}; logs: {fleet.logs}")
    finally:
        fleet.close()
