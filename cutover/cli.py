"""`lifeline cutover plan|execute|rollback|show|list|gate|mesh-route …` and `lifeline zonal-shift start|cancel|list`.

Like `lifeline catalog`, these talk to the database through the service
and flows, not to the API: a cutover or its rollback must still be
possible when the control-plane API is what is down. The CLI acts with the
tiers the served control plane has: the snapshot's l7 and mesh, and the
drivers, policy and capacity plans of `LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE`
(cutover/driver_config.py). Whoever can run this holds the database
credentials, so break-glass needs only `--reason` here; every mutation is
audited as `cli:<user>` and writes the same events as the API.

Mounted by lifeline/cli.py as `cutover` (cutover_app) and `zonal-shift`
(zonal_shift_app).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from controlplane.cli_support import audited_command, cli_actor, cli_database, load_settings, read_only

if TYPE_CHECKING:
    from controlplane.config import ControlPlaneSettings
    from cutover.service import CutoverRuntime

cutover_app = typer.Typer(no_args_is_help=True, add_completion=False,
                          help="Tiered cutovers: plan, execute, verify, roll back.")
zonal_shift_app = typer.Typer(no_args_is_help=True, add_completion=False,
                              help="Zonal shifts: a zone out of routing until it expires (≤ 72 h).")

mesh_route_app = typer.Typer(no_args_is_help=True, add_completion=False,
                              help="Mesh routes: a model's split across versions and zones, per cohort.")
cutover_app.add_typer(mesh_route_app, name="mesh-route")

T = TypeVar("T")
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a summary.")]


def _print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def _run(settings: ControlPlaneSettings, *, action: str, target: str, work: Callable[[CutoverRuntime], T]) -> T:
    """Run a flow (which commits per step) with the tiers the served control plane has; audited either way.

    The snapshot's l7 and mesh, and the drivers and policy of `cutover_drivers_file`
    (cutover/driver_config.py), so a rollback from the CLI — the way back while the API is down — restores
    every tier a cutover touched, under the same rules.
    """
    from common.clock import SystemClock
    from controlplane.auth.service import record_audit
    from controlplane.db import build_session_factory, session_scope
    from cutover.driver_config import CutoverDriverConfigError, build_drivers, load
    from cutover.l7 import SnapshotL7Driver
    from cutover.mesh import SnapshotMeshDriver
    from cutover.policy import CutoverPolicy
    from cutover.service import CutoverRuntime

    clock = SystemClock()
    try:
        config = load(settings.cutover_drivers_file) if settings.cutover_drivers_file is not None else None
        configured = build_drivers(config, clock=clock) if config is not None else []
    except CutoverDriverConfigError as exc:  # names the file and the key, as `controlplane serve` says it
        typer.echo(f"error: bad configuration: {exc}", err=True)
        raise typer.Exit(2) from None
    policy = config.policy.build() if config is not None and config.policy is not None else CutoverPolicy()
    capacity = config.capacity.build() if config is not None and config.capacity is not None else None
    with audited_command(settings, action=action, target=target), cli_database(settings) as factory:
        read_factory = build_session_factory(factory.kw["bind"], read_only=True)
        runtime = CutoverRuntime(factory=factory, clock=clock, record_unconfigured=True, policy=policy,
                                 capacity=capacity, drivers=[
            SnapshotL7Driver(factory, read_factory=read_factory, clock=clock, sleep=time.sleep),
            SnapshotMeshDriver(factory, read_factory=read_factory, clock=clock, sleep=time.sleep),
            *configured])
        result = work(runtime)
        with session_scope(factory) as session:
            record_audit(session, actor=cli_actor(), action=action, target=target, outcome="succeeded",
                         status_code=None, clock=clock)
        return result


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


def _brief(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k != "target"}


def _parse_duration(text: str) -> timedelta:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if match:
        unit = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
        return timedelta(seconds=float(match.group(1)) * unit)
    from pydantic import TypeAdapter, ValidationError

    try:
        return TypeAdapter(timedelta).validate_python(text)
    except ValidationError as exc:
        typer.echo(f"error: invalid_request: {text!r} is not a duration (90m, 2h, PT2H)", err=True)
        raise typer.Exit(2) from exc


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
    from cutover.schemas import CutoverPlanRequest
    from cutover.tiers import Scope

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

    cutover, violations = _run(load_settings(), action="cutover.plan", target=scope.key, work=work)
    if as_json:
        _print_json({**_cutover_json(cutover), "safety": [v.as_json() for v in violations]})
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
    done = _run(load_settings(), action="cutover.execute", target=f"cutover:{cutover_id}",
                work=lambda runtime: flows.execute(runtime, cutover_id=cutover_id, idempotency_key=key,
                                                   actor=cli_actor(), break_glass=break_glass,
                                                   break_glass_reason=reason))
    if as_json:
        _print_json(_cutover_json(done))
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

    done = _run(load_settings(), action="cutover.rollback", target=f"cutover:{cutover_id}",
                work=lambda runtime: flows.rollback(runtime, cutover_id=cutover_id, actor=cli_actor(),
                                                    reason=reason))
    _print_json(_cutover_json(done)) if as_json else typer.echo(_summary(done))
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

    done = _run(load_settings(), action="cutover.abort", target=f"cutover:{cutover_id}",
                work=lambda runtime: flows.abort(runtime, cutover_id=cutover_id, actor=cli_actor(), reason=reason))
    _print_json(_cutover_json(done)) if as_json else typer.echo(_summary(done))


@cutover_app.command()
def show(cutover_id: int) -> None:
    """One cutover with its steps, recorded before-states and evidence (JSON)."""
    from cutover import service

    _print_json(read_only(load_settings(),
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
        _print_json(rows)
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

    found = _run(load_settings(), action="cutover.gate", target="cutover-gate", work=work)
    typer.echo(f"cutover stop switch {'ON' if found.stopped else 'off'} (revision {found.revision})")


@zonal_shift_app.command()
def start(
    region: str,
    zone: str,
    expires_in: Annotated[str, typer.Option(help="Mandatory, ≤ 72h: 90m, 2h, PT2H.")],
    reason: Annotated[str, typer.Option(help="Why.")],
) -> None:
    """Take ZONE of REGION out of routing until the expiry; it reverts by itself then."""
    from cutover import zonal_shift

    duration = _parse_duration(expires_in)
    shift = _run(load_settings(), action="zonal_shift.start", target=f"region:{region}/zone:{zone}",
                 work=lambda runtime: zonal_shift.start(runtime, region=region, zone=zone, expires_in=duration,
                                                        reason=reason, actor=cli_actor()))
    if shift.ended_at is not None:
        typer.echo(f"zonal shift #{shift.id} of {region}/{zone} did not take effect ({shift.end_reason}); "
                   f"see cutover #{shift.cutover_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"zonal shift #{shift.id}: {region}/{zone} out until {shift.expires_at.isoformat()} "
               f"(cutover #{shift.cutover_id})")


@zonal_shift_app.command()
def cancel(shift_id: int, reason: Annotated[str, typer.Option(help="Why it ends early.")]) -> None:
    """End a zonal shift now: its cutover is rolled back and the zone returns."""
    from cutover import zonal_shift

    shift = _run(load_settings(), action="zonal_shift.cancel", target=f"zonal-shift:{shift_id}",
                 work=lambda runtime: zonal_shift.cancel(runtime, shift_id=shift_id, actor=cli_actor(),
                                                         reason=reason))
    if shift.ended_at is None:
        typer.echo(f"zonal shift #{shift_id} could not be reverted; see cutover #{shift.cutover_id}", err=True)
        raise typer.Exit(1)
    typer.echo(f"zonal shift #{shift.id} cancelled; {shift.region}/{shift.zone} is back")


@zonal_shift_app.command("list")
def list_shifts(
    active: Annotated[bool, typer.Option("--active/--all", help="Only shifts still in force.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """List zonal shifts, newest first."""
    from cutover import zonal_shift
    from cutover.schemas import ZonalShiftRead

    def rows(session: Any) -> list[dict[str, Any]]:
        out = []
        for shift in zonal_shift.list_shifts(session, active_only=active):
            read = ZonalShiftRead.model_validate(shift)
            read.active = read.ended_at is None
            out.append(read.model_dump(mode="json"))
        return out

    found = read_only(load_settings(), rows)
    if as_json:
        _print_json(found)
        return
    for row in found:
        status = "active" if row["active"] else row["end_reason"]
        typer.echo(f"#{row['id']:<5} {row['region']}/{row['zone']:<20} {status:<10} expires {row['expires_at']}  "
                   f"{row['reason']}")


# ---------------------------------------------------------------- mesh routes

_DESTINATION = re.compile(r"^(?P<version>[^@=\s]+)(?:@(?P<zone>[^@=\s]+))?=(?P<weight>\d+)$")


def _destinations(specs: list[str]) -> list[dict[str, Any]]:
    out = []
    for spec in specs:
        match = _DESTINATION.fullmatch(spec)
        if match is None:
            typer.echo(f"error: invalid_request: --dest {spec!r} is not VERSION[@ZONE]=WEIGHT", err=True)
            raise typer.Exit(2)
        out.append({"version": match["version"], "zone": match["zone"], "weight": int(match["weight"])})
    return out


def _route_line(route: dict[str, Any]) -> str:
    split = " ".join(f"{d['version']}{'@' + d['zone'] if d.get('zone') else ''}={d['weight']}"
                     for d in route["destinations"])
    return (f"{route['model']:<16} {route['region'] or '*':<12} {route['cohort'] or '*':<12} "
            f"r{route['revision']:<4} {split}  ({route['reason']})")


@mesh_route_app.command("list")
def mesh_route_list(as_json: JsonFlag = False) -> None:
    """Every mesh route: model, region (* = all), cohort (* = default), revision and split."""
    from cutover import mesh

    rows = read_only(load_settings(), lambda session: [r.model_dump(mode="json") for r in mesh.list_routes(session)])
    if as_json:
        _print_json(rows)
        return
    for row in rows:
        typer.echo(_route_line(row))


@mesh_route_app.command("set")
def mesh_route_set(
    model: str,
    dest: Annotated[list[str], typer.Option("--dest", help="VERSION[@ZONE]=WEIGHT; repeat per destination.")],
    reason: Annotated[str, typer.Option(help="Why.")],
    region: Annotated[str | None, typer.Option(help="Only this region; omitted: every region.")] = None,
    cohort: Annotated[str | None, typer.Option(help="X-Lifeline-Cohort; omitted: the default route.")] = None,
    expected_revision: Annotated[int | None, typer.Option(help="Compare-and-set; 0: must be new.")] = None,
) -> None:
    """Create or replace a mesh route (one snapshot version, one mesh.route event), as PUT /api/v1/mesh-routes."""
    from pydantic import ValidationError

    from controlplane.cli_support import run_mutation
    from cutover import mesh

    try:
        spec = mesh.MeshRouteSpec(model=model, region=region, cohort=cohort, destinations=_destinations(dest),
                                  reason=reason, expected_revision=expected_revision)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'route'}: {e['msg']}"
                             for e in exc.errors(include_url=False))
        typer.echo(f"error: invalid_request: {problems}", err=True)
        raise typer.Exit(2) from None
    route = run_mutation(load_settings(), action="mesh_route.set", target=f"mesh-route:{model}",
                         work=lambda session, clock: mesh.put_route(session, spec, actor=cli_actor(), clock=clock))
    typer.echo(_route_line(route.model_dump(mode="json")))


@mesh_route_app.command("delete")
def mesh_route_delete(
    model: str,
    reason: Annotated[str, typer.Option(help="Why.")],
    region: Annotated[str | None, typer.Option(help="The route of this region; omitted: the every-region one.")] = None,
    cohort: Annotated[str | None, typer.Option(help="The route of this cohort; omitted: the default route.")] = None,
    expected_revision: Annotated[int | None, typer.Option(help="Compare-and-set.")] = None,
) -> None:
    """Remove a mesh route (one snapshot version, one mesh.route event); refused while a cutover holds it."""
    from controlplane.cli_support import run_mutation
    from cutover import mesh

    route = run_mutation(load_settings(), action="mesh_route.delete", target=f"mesh-route:{model}",
                         work=lambda session, clock: mesh.delete_route(
                             session, model=model, region=region, cohort=cohort, reason=reason, actor=cli_actor(),
                             clock=clock, expected_revision=expected_revision))
    typer.echo(f"deleted: {_route_line(route.model_dump(mode='json'))}")
