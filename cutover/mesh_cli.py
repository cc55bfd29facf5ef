"""`lifeline cutover mesh-route list|set|delete`: the mesh tier's version/zone splits, per cohort.

Mounted under `lifeline cutover` by cutover/cli.py. Like the rest of
that CLI these go through the database (controlplane/mesh_route), not the API,
and write the same `mesh.route` event and snapshot version as
`PUT`/`DELETE /api/v1/mesh-routes`; every mutation is audited as
`cli:<user>`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer

from controlplane.cli_support import cli_actor, load_settings, read_only
from cutover.cli_runtime import JsonFlag, print_json

mesh_route_app = typer.Typer(no_args_is_help=True, add_completion=False,
                             help="Mesh routes: a model's split across versions and zones, per cohort.")


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
    from controlplane.mesh_route import service as mesh_routes

    rows = read_only(load_settings(),
                     lambda session: [r.model_dump(mode="json") for r in mesh_routes.list_routes(session)])
    if as_json:
        print_json(rows)
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
    from controlplane.mesh_route import service as mesh_routes
    from controlplane.mesh_route.schemas import MeshRouteSpec

    try:
        spec = MeshRouteSpec(model=model, region=region, cohort=cohort, destinations=_destinations(dest),
                                  reason=reason, expected_revision=expected_revision)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'route'}: {e['msg']}"
                             for e in exc.errors(include_url=False))
        typer.echo(f"error: invalid_request: {problems}", err=True)
        raise typer.Exit(2) from None
    route = run_mutation(load_settings(), action="mesh_route.set", target=f"mesh-route:{model}",
                         work=lambda session, clock: mesh_routes.put_route(session, spec, actor=cli_actor(), clock=clock))
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
    from controlplane.mesh_route import service as mesh_routes
    from cutover.repository import mesh_route_holders

    route = run_mutation(load_settings(), action="mesh_route.delete", target=f"mesh-route:{model}",
                         work=lambda session, clock: mesh_routes.delete_route(
                             session, model=model, region=region, cohort=cohort, reason=reason, actor=cli_actor(),
                             clock=clock, held_by=mesh_route_holders, expected_revision=expected_revision))
    typer.echo(f"deleted: {_route_line(route.model_dump(mode='json'))}")
