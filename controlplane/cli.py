"""`lifeline controlplane serve|migrate|token create|list|revoke|events export|epoch show|rotate`.

SQLAlchemy, uvicorn and the app are imported inside the commands, so
mounting this sub-app costs `lifeline engine serve` nothing.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from controlplane.cli_support import audited_command, cli_actor, fail, load_settings, read_only, run_mutation

controlplane_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Central control plane.")
token_app = typer.Typer(no_args_is_help=True, add_completion=False, help="API tokens.")
events_app = typer.Typer(no_args_is_help=True, add_completion=False, help="The event log.")
controlplane_app.add_typer(token_app, name="token")
controlplane_app.add_typer(events_app, name="events")
epoch_app = typer.Typer(no_args_is_help=True, add_completion=False,
                        help="The database's epoch: snapshot versions compare only within one.")
controlplane_app.add_typer(epoch_app, name="epoch")

@controlplane_app.command()
def serve(
    port: Annotated[int | None, typer.Option(help="Port to listen on (LIFELINE_CONTROLPLANE_PORT).")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (LIFELINE_CONTROLPLANE_HOST).")] = None,
) -> None:
    """Serve the admin API under /api/v1 (OpenAPI at /docs)."""
    import uvicorn

    from controlplane.app import create_app
    from common.logs import configure_logging

    from controlplane.alerts.routes import AlertRoutesError
    from cutover.drivers_file import CutoverDriverConfigError

    settings = load_settings(port=port, host=host)
    configure_logging(settings.log_level, component="controlplane")
    try:
        app = create_app(settings)
    except (CutoverDriverConfigError, AlertRoutesError) as exc:  # the message names the file and the key
        typer.echo(f"error: bad configuration: {exc}", err=True)
        raise typer.Exit(2) from None
    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None)


@controlplane_app.command()
def migrate(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    downgrade: Annotated[bool, typer.Option("--downgrade", help="Downgrade to REVISION instead.")] = False,
) -> None:
    """Upgrade the database (LIFELINE_CONTROLPLANE_DATABASE_URL) to the latest schema."""
    from controlplane import schema as db

    settings = load_settings()
    url = settings.resolved_database_url()
    if downgrade:
        db.downgrade(url, revision)
    else:
        db.upgrade(url, revision)
    typer.echo(f"database {'downgraded' if downgrade else 'upgraded'} to {revision}")


@token_app.command("create")
def token_create(
    role: Annotated[str, typer.Option(help="viewer | operator | admin | gateway | agent")],
    name: Annotated[str, typer.Option(help="What the token is for.")] = "bootstrap",
) -> None:
    """Create an API token and print it once. Bootstraps the first admin."""
    from controlplane.auth import service
    from controlplane.auth.roles import Role

    settings = load_settings()
    with audited_command(settings, action="token.create", target=f"token:{name}"):
        try:
            parsed = Role(role)
        except ValueError:
            fail("invalid_request", f"role must be one of {', '.join(r.value for r in Role)}", code=2)
    token, secret = run_mutation(
        settings,
        action="token.create",
        target=f"token:{name}",
        work=lambda session, clock: service.create_token(
            session, name=name, role=parsed, created_by=cli_actor(), clock=clock
        ),
    )
    typer.echo(secret)
    typer.echo(f"created {parsed.value} token #{token.id} {name!r}; it is shown only once", err=True)


@token_app.command("list")
def token_list(
    include_revoked: Annotated[bool, typer.Option("--all/--active", help="Show revoked tokens too.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
) -> None:
    """List API tokens (never their secrets, which are not stored)."""
    import json

    from controlplane.auth import service
    from controlplane.auth.schemas import TokenRead

    settings = load_settings()
    rows = read_only(
        settings,
        lambda session: [TokenRead.model_validate(t) for t in service.list_tokens(session, include_revoked=include_revoked)],
    )
    if as_json:
        typer.echo(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
        return
    typer.echo(f"{'id':>5}  {'role':<8}  {'state':<7}  {'created':<25}  name")
    for row in rows:
        state = "active" if row.active else "revoked"
        typer.echo(f"{row.id:>5}  {row.role.value:<8}  {state:<7}  {row.created_at.isoformat():<25}  {row.name}")


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(help="The token's id (see `token list`).", min=1, max=2**31 - 1)],
) -> None:
    """Revoke a token at once. The last active admin token cannot be revoked."""
    from controlplane.auth import service

    settings = load_settings()
    token = run_mutation(
        settings,
        action="token.revoke",
        target=f"token:#{token_id}",
        work=lambda session, clock: service.revoke_token(session, token_id=token_id, actor=cli_actor(), clock=clock),
    )
    typer.echo(f"revoked {token.role} token #{token.id} {token.name!r}")


@events_app.command("export")
def events_export(
    kind: Annotated[str | None, typer.Option()] = None,
    routing_tier: Annotated[str | None, typer.Option(help="l7 | mesh | anycast | dns")] = None,
    scope: Annotated[str | None, typer.Option(help="scope prefix")] = None,
) -> None:
    """Write matching events as JSON lines to stdout, oldest first."""
    from controlplane.event import service
    from contract.routing_tier import RoutingTier
    from controlplane.event.repository import EventFilter

    try:
        tier = RoutingTier(routing_tier) if routing_tier else None
    except ValueError:
        fail("invalid_request", "--routing-tier must be l7, mesh, zone or dns", code=2)
    flt = EventFilter(kind=kind, routing_tier=tier, scope_prefix=scope)
    settings = load_settings()
    read_only(settings, lambda session: sys.stdout.writelines(service.export_jsonl(session, flt)))


@epoch_app.command("show")
def epoch_show() -> None:
    """Print the database's epoch and snapshot version."""
    from controlplane.routing_version import service

    settings = load_settings()
    stamp = read_only(settings, service.stamp)
    typer.echo(f"epoch {stamp.epoch} version {stamp.version}")


@epoch_app.command("rotate")
def epoch_rotate(
    reason: Annotated[str, typer.Option(help="Why, for the event log (e.g. 'restored from the 03:00 backup').")],
) -> None:
    """Start a new epoch: run it after restoring this database from a backup, or on a clone.

    A restored database serves versions its gateways already applied with
    other content, and they refuse its lower ones; after this they take the
    next snapshot whatever its version.
    """
    from controlplane.event import service as events
    from contract.routing_tier import RoutingTier
    from controlplane.routing_version import service

    if not reason.strip():
        fail("invalid_request", "--reason must not be empty", code=2)
    settings = load_settings()

    def work(session, clock):  # type: ignore[no-untyped-def]
        old, new = service.rotate_epoch(session, clock=clock)
        events.record(session, kind="controlplane.epoch_rotated", actor=cli_actor(), reason=reason,
                      scope="controlplane", clock=clock, before={"epoch": old}, after={"epoch": new},
                      routing_tier=RoutingTier.L7)
        return old, new

    old, new = run_mutation(settings, action="controlplane.epoch.rotate", target="controlplane:epoch", work=work)
    typer.echo(f"epoch {old} -> {new}; gateways and agents take the next snapshot whatever its version")
