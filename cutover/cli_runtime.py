"""What every `lifeline cutover …` / `lifeline zonal-shift …` command that acts shares: the tiers, audited.

`run_with_tiers` builds the same runtime the served control plane has
(the snapshot's l7 and mesh, and the drivers, policy and capacity plans
of `LIFELINE_CONTROLPLANE_CUTOVER_DRIVERS_FILE`) and runs one flow with
it inside an audited command; a bad drivers file is exit 2 naming the
file and the key, as `lifeline controlplane serve` says it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from controlplane.cli_support import audited_command, cli_actor, cli_database

if TYPE_CHECKING:
    from controlplane.config import ControlPlaneSettings
    from cutover.service import CutoverRuntime

T = TypeVar("T")
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a summary.")]


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def run_with_tiers(settings: ControlPlaneSettings, *, action: str, target: str, work: Callable[[CutoverRuntime], T]) -> T:
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
