"""Lifeline keeps LLM inference serving through failures: streams that survive an engine's death, warm pools
sized for a zone's loss, and tiered cutovers (l7, mesh, anycast, dns) across regions, with drills that measure it.

Start with `lifeline demo` (two regions on real processes through a scripted outage).
"""

# The one `lifeline` command; each component mounts its own sub-command. Sub-command modules import their heavy
# dependencies (torch, SQLAlchemy) inside the command bodies, so `lifeline --help` stays fast and an engine
# process never imports the ORM.

from __future__ import annotations

import typer

from controlplane.cli import controlplane_app
from controlplane.drill.cli import drill_app
from controlplane.replication.cli import replication_app
from controlplane.slo.cli import slo_app
from cutover.cli import cutover_app, zonal_shift_app
from engine.cli import engine_app, model_app
from gateway.cli import gateway_app
from holder.cli import holder_app
from lifeline.demo import demo
from warm_pool.cli import agent_app, pool_app
from weight_catalog.cli import catalog_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
app.add_typer(engine_app, name="engine", help="Reference inference engine (vLLM API subset).")
app.add_typer(model_app, name="model", help="Build deterministic reference models.")
app.add_typer(gateway_app, name="gateway", help="LLM-aware gateway: streams survive engine crashes.")
app.add_typer(controlplane_app, name="controlplane", help="Central control plane (API, migrations, tokens).")
app.add_typer(catalog_app, name="catalog", help="Weight-version catalog.")
app.add_typer(cutover_app, name="cutover", help="Tiered cutovers (l7, mesh, anycast, dns): plan, execute, roll back.")
app.add_typer(zonal_shift_app, name="zonal-shift", help="Take a zone out of routing until an expiry (at most 72 h).")
app.add_typer(pool_app, name="pool", help="Warm pools sized for the loss of a zone.")
app.add_typer(agent_app, name="agent", help="Regional agent: probes, canaries, leases for stock engines, pool.")
app.add_typer(holder_app, name="holder", help="Memory holder: weights and KV blocks that outlive the engine.")
app.add_typer(drill_app, name="drill", help="Drills: instance weekly, zone monthly, region quarterly.")
app.add_typer(replication_app, name="replication", help="KV checkpoint replication: policies, worker, beat, status.")
app.add_typer(slo_app, name="slo", help="SLO documents that state only what a drill measured.")
app.command("demo")(demo)

if __name__ == "__main__":  # pragma: no cover
    app()
