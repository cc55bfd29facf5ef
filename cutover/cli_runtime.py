"""What every `lifeline cutover …` / `lifeline zonal-shift …` command that acts shares: the tiers, audited.

`run_with_tiers` builds the runtime the served control plane has
(`cutover.runtime.build_runtime`: the snapshot's l7 and mesh, and the
drivers, policy and capacity plans of
`LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE`) and runs one flow with it
inside an audited command; a bad drivers file is exit 2 naming the file
and the key, as `lifeline controlplane serve` says it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from controlplane.cli_support import audited_command, cli_actor, cli_database

if TYPE_CHECKING:
    from controlplane.config import ControlPlaneSettings
    from cutover.runtime import CutoverRuntime

T = TypeVar("T")
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a summary.")]


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def run_with_tiers(settings: ControlPlaneSettings, *, action: str, target: str, work: Callable[[CutoverRuntime], T]) -> T:
    """Run a flow (which commits per step) with the runtime the served control plane has; audited either way.

    `cutover.runtime.build_runtime`, as `create_app` builds it: the snapshot's l7 and mesh, and the drivers,
    policy and capacity plans of `cutover_drivers_file` (cutover/drivers_file.py), so a rollback from the
    CLI — the way back while the API is down — restores every tier a cutover touched, under the same rules.
    The snapshot's tiers verify by the snapshot version alone here (no gateway reports are read).
    """
    from common.clock import SystemClock
    from controlplane.auth.service import record_audit
    from controlplane.db import build_session_factory, session_scope
    from cutover.drivers_file import CutoverDriverConfigError
    from cutover.runtime import build_runtime

    clock = SystemClock()
    try:
        with audited_command(settings, action=action, target=target), cli_database(settings) as factory:
            read_factory = build_session_factory(factory.kw["bind"], read_only=True)
            runtime = build_runtime(settings, factory=factory, read_factory=read_factory, clock=clock)
            result = work(runtime)
            with session_scope(factory) as session:
                record_audit(session, actor=cli_actor(), action=action, target=target, outcome="succeeded",
                             status_code=None, clock=clock)
            return result
    except CutoverDriverConfigError as exc:  # names the file and the key, as `controlplane serve` says it; unaudited
        typer.echo(f"error: bad configuration: {exc}", err=True)
        raise typer.Exit(2) from None


def parse_duration(text: str) -> timedelta:
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
