"""`lifeline cutover plan|execute|rollback|abort|show|list|gate` and `lifeline zonal-shift start|cancel|list`.

Like `lifeline catalog`, these talk to the database through the service
and flows, not to the API: a cutover or its rollback must still be
possible when the control-plane API is what is down. The CLI acts with the
tiers the served control plane has: the snapshot's l7 and mesh, and the
drivers, policy and capacity plans of `LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE`
(cutover/drivers_file.py). Whoever can run this holds the database
credentials, so break-glass needs only `--reason` here; every mutation is
audited as `cli:<user>` and writes the same events as the API.

Mounted by lifeline/cli.py as `cutover` (cutover_app) and `zonal-shift`
(zonal_shift_app, from cutover/zonal_shift_cli.py); `mesh-route` is
cutover/mesh_cli.py; what the acting commands share is cutover/cli_runtime.py.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controlplane.cli_support import cli_actor, load_settings, read_only
from cutover.cli_runtime import JsonFlag, print_json, run_with_tiers
from cutover.mesh_cli import mesh_route_app
from cutover.zonal_shift_cli import zonal_shift_app

if TYPE_CHECKING:
    from cutover.drivers.step import StepState
    from cutover.runtime import CutoverRuntime

__all__ = ["cutover_app", "zonal_shift_app"]

cutover_app = typer.Typer(no_args_is_help=True, add_completion=False,
                          help="Tiered cutovers: plan, execute, verify, roll back.")
cutover_app.add_typer(mesh_route_app, name="mesh-route")  # cutover/mesh_cli.py


def _cutover_json(cutover: Any) -> dict[str, Any]:
    from cutover.schemas import CutoverRead

    return CutoverRead.model_validate(cutover).model_dump(mode="json")


def _summary(cutover: Any) -> str:
    lines = [f"cutover #{cutover.id} {cutover.scope} {cutover.tier} {cutover.target_state}: {cutover.state}"
             + (f" ({cutover.failure})" if cutover.failure else "")]
    for step in cutover.steps:
        lines.append(f"  {step.position}. {step.tier:<7} {step.driver}:{step.driver_target}  "
                     f"{json.dumps(_brief(step.expected_before))} -> {json.dumps(_brief(step.expected_after))}  "
                     f"[{step.status}]")
    return "\n".join(lines)


def _brief(state: StepState) -> dict[str, Any]:
    return state.model_dump(mode="json", exclude={"target"})


@cutover_app.command()
def plan(
    region: Annotated[str, typer.Option(help="The region (the scope, unless --zone or --instance).")],
    reason: Annotated[str, typer.Option(help="Why; recorded on every event.")],
    tier: Annotated[str, typer.Option(help="l7 | mesh | anycast | dns")] = "l7",
    zone: Annotated[str | None, typer.Option(help="Scope: this zone of the region.")] = None,
    instance: Annotated[str | None, typer.Option(help="Scope: this instance of the region.")] = None,
    generation: Annotated[int | None, typer.Option(help="The instance's endpoint generation (l7).")] = None,
    target: Annotated[str, typer.Option(help="out | in")] = "out",
    as_json: JsonFlag = False,
) -> None:
    """Plan a cutover (dry run): list every step with its expected before/after. Changes no routing."""
    from pydantic import ValidationError

    from controlplane.db import session_scope
    from cutover import service
    from cutover.scope import Scope
    from cutover.schemas import CutoverPlanRequest

    kind = "instance" if instance else "zone" if zone else "region"
    try:
        request = CutoverPlanRequest(scope={"kind": kind, "region": region, "name": instance or zone},
                                     tier=tier, target_state=target, reason=reason, generation=generation)
    except ValidationError as exc:
        typer.echo(f"error: invalid_request: {exc}", err=True)
        raise typer.Exit(2) from exc
    scope = Scope(request.scope.kind, request.scope.region, request.scope.name or region)

    def work(runtime: CutoverRuntime) -> tuple[Any, list[Any]]:
        with session_scope(runtime.factory) as session:
            return service.plan(session, runtime, scope=scope, tiers=[request.tier],
                                target_state=request.target_state, reason=request.reason, mode=request.mode,
                                actor=cli_actor(), generation=request.generation)

    cutover, violations = run_with_tiers(load_settings(), action="cutover.plan", target=scope.key, work=work)
    if as_json:
        print_json({**_cutover_json(cutover), "safety": [v.as_json() for v in violations]})
        return
    typer.echo(_summary(cutover))
    for violation in violations:
        typer.echo(f"  would be refused now: {violation.rule}: {violation.message}")


@cutover_app.command()
def execute(
    cutover_id: int,
    key: Annotated[str | None, typer.Option(help="Idempotency key; the same key again never runs twice.")] = None,
    break_glass: Annotated[bool, typer.Option(help="Override the safety rules (audited).")] = False,
    reason: Annotated[str | None, typer.Option(help="Break-glass reason.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Execute a planned cutover (or resume one a crash left); exit 1 unless it completed."""
    from cutover import flows

    key = key or f"cli-{uuid.uuid4().hex}"
    done = run_with_tiers(load_settings(), action="cutover.execute", target=f"cutover:{cutover_id}",
                work=lambda runtime: flows.execute(runtime, cutover_id=cutover_id, idempotency_key=key,
                                                   actor=cli_actor(), break_glass=break_glass,
                                                   break_glass_reason=reason))
    if as_json:
        print_json(_cutover_json(done))
    else:
        typer.echo(f"idempotency key {key}")
        typer.echo(_summary(done))
    if done.state != "completed":
        raise typer.Exit(1)


@cutover_app.command()
def rollback(
    cutover_id: int,
    reason: Annotated[str, typer.Option(help="Why it goes back.")],
    as_json: JsonFlag = False,
) -> None:
    """Restore the recorded before-states of every touched step; exit 1 unless rolled back."""
    from cutover import flows

    done = run_with_tiers(load_settings(), action="cutover.rollback", target=f"cutover:{cutover_id}",
                work=lambda runtime: flows.rollback(runtime, cutover_id=cutover_id, actor=cli_actor(),
                                                    reason=reason))
    print_json(_cutover_json(done)) if as_json else typer.echo(_summary(done))
    if done.state != "rolled_back":
        raise typer.Exit(1)


@cutover_app.command()
def abort(
    cutover_id: int,
    reason: Annotated[str, typer.Option(help="Why it stops.")],
    as_json: JsonFlag = False,
) -> None:
    """Stop a running cutover at its next step boundary and roll it back (at once if its runner is gone)."""
    from cutover import flows

    done = run_with_tiers(load_settings(), action="cutover.abort", target=f"cutover:{cutover_id}",
                work=lambda runtime: flows.abort(runtime, cutover_id=cutover_id, actor=cli_actor(), reason=reason))
    print_json(_cutover_json(done)) if as_json else typer.echo(_summary(done))


@cutover_app.command()
def show(cutover_id: int) -> None:
    """One cutover with its steps, recorded before-states and evidence (JSON)."""
    from cutover import service

    print_json(read_only(load_settings(),
                          lambda session: _cutover_json(service.get_or_raise(session, cutover_id=cutover_id))))


@cutover_app.command("list")
def list_cutovers(
    state: Annotated[str | None, typer.Option(help="Only cutovers in this state.")] = None,
    scope: Annotated[str | None, typer.Option(help="Scope prefix, e.g. region:eu")] = None,
    as_json: JsonFlag = False,
) -> None:
    """List cutovers, newest first."""
    from cutover import service
    from cutover.states import CutoverState

    try:
        parsed = CutoverState(state) if state else None
    except ValueError as exc:
        typer.echo(f"error: invalid_request: --state must be one of {', '.join(CutoverState)}", err=True)
        raise typer.Exit(2) from exc
    rows = read_only(load_settings(), lambda session: [
        _cutover_json(c) for c in service.list_cutovers(session, state=parsed, scope=scope)])
    if as_json:
        print_json(rows)
        return
    for row in rows:
        typer.echo(f"#{row['id']:<5} {row['state']:<12} {row['tier']:<7} {row['target_state']:<3} "
                   f"{row['scope']:<32} {row['created_at']}  {row['reason']}")


@cutover_app.command()
def gate(
    reason: Annotated[str, typer.Option(help="Why.")],
    stop: Annotated[bool, typer.Option("--stop/--release", help="Stop every new cutover, or release the stop.")],
) -> None:
    """The global stop switch (a gating rule). Rollbacks and zonal-shift expiries are never stopped."""
    from controlplane.db import session_scope
    from cutover import service

    def work(runtime: CutoverRuntime) -> Any:
        with session_scope(runtime.factory) as session:
            return service.set_gate(session, stopped=stop, reason=reason, actor=cli_actor(), clock=runtime.clock)

    found = run_with_tiers(load_settings(), action="cutover.gate", target="cutover-gate", work=work)
    typer.echo(f"cutover stop switch {'ON' if found.stopped else 'off'} (revision {found.revision})")
