"""`lifeline demo`: Lifeline's promises on a small real fleet, two regions × two zones, on the embedded default.

It builds the tiny model, starts the routing systems the machine has
(BIND9 for the dns tier, BIRD 2 + ExaBGP for anycast: `tiers.py`), a
private Redis (the lease registries) and the control plane (SQLite in the
work dir, its tier drivers from the drivers file the demo writes), registers
the model and promotes it to `prod`. Each region gets a gateway routing by
the snapshot and a regional agent whose `local` pool runs the serving and
warm engines `lifeline pool plan` asks for; the canary is recorded into the
catalog from two verified instances. Steady streaming traffic (the `openai`
client) runs at both regions for the whole run while the scenarios play
(`scenarios.py`); each ends as one table row, and the report directory
(`report.py`) gets the tables, the events, a timeline plot and the SLO
document. Exit status 1 if any promise was broken, 130 on Ctrl-C; every
process started is stopped on every way out. docs/demo.md says what each
scenario proves.

The modules behind the command are imported when it runs, not when
`lifeline` starts: a broken demo must never break the other sub-commands.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class DemoEngine(StrEnum):
    """What the pools run: the reference engine (every scenario), or stock vLLM (the scenarios that apply)."""

    REFERENCE = "reference"
    VLLM = "vllm"


def demo(
    workdir: Annotated[Path, typer.Option(help="Model, database, configs, reports and logs go here")] = Path(
        ".lifeline/demo"),
    max_tokens: Annotated[int, typer.Option(min=16, max=1024, help="Tokens per long (pinned) stream")] = 64,
    kill_after: Annotated[int, typer.Option(min=1, help="Inject each mid-stream fault after this many tokens")] = 20,
    quick: Annotated[bool, typer.Option("--quick", help="One region, SIGKILL and corrupted weights only "
                                        "(about a minute); what CI runs")] = False,
    outage_s: Annotated[float, typer.Option(min=1, max=120, help="How long the control plane's API is stopped "
                                            "(issue 17: 20 s)")] = 20.0,
    engine: Annotated[DemoEngine, typer.Option(help="What the pools run: `vllm` plays the scenarios that apply to "
                                               "stock vLLM (installed by `make vllm`) and says which it skips")]
    = DemoEngine.REFERENCE,
) -> None:
    """Two regions on real processes through a scripted outage; a table row per scenario and a report directory."""
    from lifeline.demo.run import run_demo

    if kill_after >= max_tokens:
        raise typer.BadParameter("must be below --max-tokens", param_hint="--kill-after")
    raise typer.Exit(run_demo(workdir.resolve(), max_tokens=max_tokens, kill_after=kill_after, quick=quick,
                              outage_s=outage_s, engine=engine.value))
