"""`lifeline slo export --model M --format md|json|html [--output FILE]`: the generated SLO document.

Reads the database through the service (no API needed). Mounted by
lifeline/cli.py as `slo`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from controlplane.cli_support import load_settings, read_only

slo_app = typer.Typer(no_args_is_help=True, add_completion=False,
                      help="SLO documents: each target beside the drill run that measured it.")


@slo_app.callback()
def slo() -> None:
    """SLO documents: each target beside the drill run that measured it (a group, so `export` stays a word)."""


@slo_app.command()
def export(model: Annotated[str, typer.Option(help="model name (as the catalog and the drills name it)")],
           fmt: Annotated[str, typer.Option("--format", help="md | json | html")] = "md",
           output: Annotated[Path | None, typer.Option(help="write here instead of stdout")] = None) -> None:
    """Export the SLO document of MODEL."""
    from common.clock import SystemClock
    from controlplane.slo import export as slo_export
    from controlplane.slo import service

    if fmt not in ("md", "json", "html"):
        typer.echo(f"error: invalid_request: --format must be md, json or html, not {fmt!r}", err=True)
        raise typer.Exit(2)
    settings = load_settings()
    text = read_only(settings, lambda session: slo_export.render(
        service.build(session, model=model, clock=SystemClock(),
                      gateway_stale_after=settings.gateway_report_stale_after,
                      agent_stale_after=settings.agent_report_stale_after, dns=service.dns_ttls(settings)), fmt))  # type: ignore[arg-type]
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text)
