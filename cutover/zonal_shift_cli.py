"""`lifeline zonal-shift start|cancel|list`: a zone out of routing until a mandatory expiry (≤ 72 h).

Mounted by lifeline/cli.py as `zonal-shift` (re-exported by cutover/cli.py).
Through the database with the served plane's tiers (cutover/cli_runtime.py),
so a shift can be cancelled while the API is down; audited as `cli:<user>`.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from controlplane.cli_support import cli_actor, load_settings, read_only
from cutover.cli_runtime import JsonFlag, parse_duration, print_json, run_with_tiers

zonal_shift_app = typer.Typer(no_args_is_help=True, add_completion=False,
                              help="Zonal shifts: a zone out of routing until it expires (≤ 72 h).")


@zonal_shift_app.command()
def start(
    region: str,
    zone: str,
    expires_in: Annotated[str, typer.Option(help="Mandatory, ≤ 72h: 90m, 2h, PT2H.")],
    reason: Annotated[str, typer.Option(help="Why.")],
) -> None:
    """Take ZONE of REGION out of routing until the expiry; it reverts by itself then."""
    from cutover import zonal_shift

    duration = parse_duration(expires_in)
    shift = run_with_tiers(load_settings(), action="zonal_shift.start", target=f"region:{region}/zone:{zone}",
                           work=lambda runtime: zonal_shift.start(runtime, region=region, zone=zone,
                                                                  expires_in=duration, reason=reason,
                                                                  actor=cli_actor()))
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

    shift = run_with_tiers(load_settings(), action="zonal_shift.cancel", target=f"zonal-shift:{shift_id}",
                           work=lambda runtime: zonal_shift.cancel(runtime, shift_id=shift_id,
                                                                   actor=cli_actor(), reason=reason))
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
        print_json(found)
        return
    for row in found:
        status = "active" if row["active"] else row["end_reason"]
        typer.echo(f"#{row['id']:<5} {row['region']}/{row['zone']:<20} {status:<10} expires {row['expires_at']}  "
                   f"{row['reason']}")
