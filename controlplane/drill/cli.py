"""`lifeline drill define|list|show|run|approve|abort|runs`.

Like `lifeline catalog` and `lifeline cutover`, these use the database
through the service layer (an abort must work when the API is what is
down); every mutation is audited as `cli:<user>` and writes the same events
as the API. `run NAME` requests a run; with `--fleet FILE`
(controlplane/drill/fleet.py) it also runs it here, blocking, and prints the
report. Mounted by lifeline/cli.py as `drill`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from controlplane.cli_support import (
    audited_command,
    cli_actor,
    cli_database,
    fail,
    load_settings,
    read_only,
    run_mutation,
)

drill_app = typer.Typer(no_args_is_help=True, add_completion=False,
                        help="Drills: define, run on a cadence or by hand, approve, abort.")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a summary.")]


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def _run_json(run: Any) -> dict[str, Any]:
    from controlplane.drill.schemas import DrillRunRead

    return DrillRunRead.model_validate(run).model_dump(mode="json")


def _summary(run: dict[str, Any]) -> str:
    extra = run.get("abort_reason") or run.get("failure") or ""
    return f"run {run['id']}: {run['state']} ({run['scope']}, model {run['model']}) {extra}".rstrip()


@drill_app.command()
def define(spec_file: Annotated[Path, typer.Argument(help="YAML or JSON drill definition (DrillSpec)")]) -> None:
    """Define a drill, or add the next version of an existing name."""
    import yaml
    from pydantic import ValidationError

    from controlplane.drill import service
    from controlplane.drill.schemas import DrillDefinitionRead, DrillSpec

    try:
        spec = DrillSpec.model_validate(yaml.safe_load(spec_file.read_text()))
    except (OSError, yaml.YAMLError, ValidationError) as error:
        fail("invalid_request", str(error), code=2)
    settings = load_settings()
    _print_json(run_mutation(settings, action="drill.define", target=spec.name, work=lambda session, clock:
                DrillDefinitionRead.model_validate(service.define(session, spec=spec, actor=cli_actor(),
                                                                  clock=clock)).model_dump(mode="json")))


@drill_app.command("list")
def list_definitions(as_json: JsonFlag = False) -> None:
    """The latest version of each drill definition."""
    from controlplane.drill import repository
    from controlplane.drill.schemas import DrillDefinitionRead

    rows = read_only(load_settings(), lambda session: [
        DrillDefinitionRead.model_validate(d).model_dump(mode="json") for d in repository.list_definitions(session)])
    if as_json:
        _print_json(rows)
        return
    for row in rows:
        typer.echo(f"{row['name']} v{row['version']}: {row['scope']} {row['fault']} on model {row['model']} "
                   f"(radius {row['blast_radius']})")


@drill_app.command()
def show(run_id: int) -> None:
    """One run, with its report (JSON)."""
    from controlplane.drill import service

    _print_json(read_only(load_settings(), lambda session: _run_json(service.get_run_or_raise(session,
                                                                                              run_id=run_id))))


@drill_app.command()
def runs(state: Annotated[str | None, typer.Option()] = None, model: Annotated[str | None, typer.Option()] = None,
         as_json: JsonFlag = False) -> None:
    """Recent runs, newest first."""
    from controlplane.drill import service

    rows = read_only(load_settings(), lambda session: [
        _run_json(r) for r in service.list_runs(session, state=state, model=model)])
    if as_json:
        _print_json(rows)
        return
    for row in rows:
        typer.echo(_summary(row))


@drill_app.command()
def run(name: str, version: Annotated[int | None, typer.Option(min=1)] = None,
        fleet: Annotated[Path | None, typer.Option(help="run it now on this fleet (fleet.py's YAML)")] = None,
        report_dir: Annotated[Path | None, typer.Option(help="write Markdown, JSON and PNG here")] = None,
        existing: Annotated[int | None, typer.Option(
            "--run", min=1, help="run this existing run of NAME (an approved zone or region run) "
                                 "instead of requesting a new one; needs --fleet")] = None) -> None:
    """Request a run of NAME; with --fleet, run it here and print its report.

    Zone and region runs wait for approval: request one, `approve` it, then
    `run NAME --run ID --fleet FILE` executes it.
    """
    from controlplane.drill import service

    settings = load_settings()
    if existing is not None:
        if fleet is None:
            fail("invalid_request", "--run needs --fleet: the fleet the run acts on", code=2)
        drilled, created = read_only(settings, lambda session: (
            (run := service.get_run_or_raise(session, run_id=existing)).definition.name, _run_json(run)))
        if drilled != name:
            fail("invalid_request", f"run {existing} is a run of drill {drilled!r}, not {name!r}", code=2)
    else:
        created = run_mutation(settings, action="drill.run", target=name, work=lambda session, clock: _run_json(
            service.create_run(session, definition=service.get_definition_or_raise(session, name=name,
                                                                                   version=version),
                               trigger="manual", actor=cli_actor(), clock=clock)))
    typer.echo(_summary(created))
    if fleet is None:
        return
    from common.clock import SystemClock
    from controlplane.drill.fleet import FileFleet
    from controlplane.drill.runner import DrillRunner, HttpEventReader

    spec = FileFleet.load(fleet)
    events = HttpEventReader(spec.spec.events.controlplane_url, spec.spec.events.token) if spec.spec.events else None
    with audited_command(settings, action="drill.execute", target=str(created["id"])), \
            cli_database(settings) as factory:
        outcome = DrillRunner(factory=factory, fleet=spec, events=events, clock=SystemClock(),
                              report_dir=report_dir or settings.drill_report_dir).run(created["id"])
    _print_json(outcome.report)
    if outcome.state.value != "passed":
        raise typer.Exit(1)


@drill_app.command()
def approve(run_id: int) -> None:
    """Approve a zone or region run so it may start."""
    from controlplane.drill import service

    typer.echo(_summary(run_mutation(load_settings(), action="drill.approve", target=str(run_id),
                                     work=lambda session, clock: _run_json(
                                         service.approve(session, run_id=run_id, actor=cli_actor(), clock=clock)))))


@drill_app.command()
def abort(run_id: int, reason: Annotated[str, typer.Option(min=1)]) -> None:
    """Abort a run; a running drill notices, stops its traffic and rolls its fault back."""
    from controlplane.drill import service

    typer.echo(_summary(run_mutation(load_settings(), action="drill.abort", target=str(run_id),
                                     work=lambda session, clock: _run_json(service.abort(
                                         session, run_id=run_id, reason=reason, actor=cli_actor(), clock=clock)))))
