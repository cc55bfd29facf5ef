"""`lifeline demo`: Lifeline's promises on a small real fleet, on the embedded default.

It builds the tiny model, starts the control plane (`lifeline controlplane
serve`, SQLite in the work dir), registers the model in its weight catalog
and promotes it to `prod`, declares a region with two zones, and starts a
gateway that routes by the control plane's snapshot (a `gateway`-role
token) with one engine per zone. It prints the snapshot version the gateway
reports having applied (GET /api/v1/gateways), streams a greedy completion
once undisturbed, then again while SIGKILLing the engine serving it: the
client's tokens must equal the undisturbed run's, with contiguous sequence
numbers and one migration. The killed engine restarts under a higher
generation.

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
from lifeline.demo.scenarios import engine_kill, restart, snapshot_line, stream

console = Console(highlight=False)

REGION = "eu-west"
ZONES = ("eu-west-a", "eu-west-b")


def demo(
    workdir: Annotated[Path, typer.Option(help="Model, database, configs, reports and logs go here")] = Path(
        ".lifeline/demo"),
    max_tokens: Annotated[int, typer.Option(min=8, max=1024, help="Tokens per stream")] = 64,
    kill_after: Annotated[int, typer.Option(min=1, help="SIGKILL the serving engine after this many tokens")] = 20,
) -> None:
    """Kill the engine serving a stream mid-flight; the client never notices."""
    from engine.model_build import build_model

    if kill_after >= max_tokens:
        raise typer.BadParameter("must be below --max-tokens", param_hint="--kill-after")
    began = time.monotonic()
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    console.print("[bold]Lifeline demo[/] — embedded default: a served SQLite control plane, gateways routing by "
                  "its snapshot, reference engines in two zones")

    model_dir = workdir / "models" / "tiny-seed0"
    if not (model_dir / "model.safetensors.index.json").exists():
        with console.status("building the tiny model …"):
            build_model(model_dir, preset_name="tiny", seed=0)
    console.print(f"[1/7] model     tiny-seed0 in {model_dir}")

    fleet = DemoFleet(workdir, model_dir)
    try:
        with console.status("starting the control plane, registering the model …"):
            version = fleet.start_controlplane()
        console.print(f"[2/7] catalog   {MODEL}/{version['version']}: {len(version['shards'])} files hashed (sha256), "
                      f"semantic fingerprint {version['fingerprint'][:16]}…, alias prod → {version['version']}; "
                      f"control plane at {fleet.controlplane.url}")

        with console.status("starting the gateway and one engine per zone …"):
            region = fleet.start_region(REGION, ZONES)
            for zone, instance_id in zip(ZONES, ("engine-a", "engine-b")):
                fleet.add_engine(region, zone, instance_id)
            fleet.wait_serving()
        console.print(f"[3/7] serving   region {REGION}: gateway {region.gateway.url}; leases {region.gateway.leases()}")
        console.print(f"[4/7] snapshot  {snapshot_line(fleet)}")

        victim, survivor = region.engine("engine-a"), region.engine("engine-b")
        reference = stream(region.gateway.url, max_tokens=max_tokens, prefer=survivor.instance_id)
        console.print(f"[5/7] reference {len(reference.token_ids)} tokens, undisturbed: {reference.text[:60]!r}…")

        killed = engine_kill(region, victim, reference, max_tokens=max_tokens, kill_after=kill_after)
        console.print(f"[6/7] fault     {killed.line}")

        with console.status(f"restarting {victim.instance_id} …"):
            before, after = restart(region, victim)
        console.print(f"[7/7] restart   {victim.instance_id} is back under generation {after} (was {before}); "
                      "frames of the old generation are refused")
        if not killed.ok:
            console.print(f"[red]the recovery promise was broken; logs in {fleet.logs}[/]")
            raise typer.Exit(1)
        console.print(f"[green]done[/] in {time.monotonic() - began:.0f} s: the client saw one unbroken, "
                      f"token-identical stream. Logs: {fleet.logs}")
    finally:
        fleet.close()
