"""`lifeline gateway serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

gateway_app = typer.Typer(no_args_is_help=True, add_completion=False)


@gateway_app.command("serve")
def serve(
    config: Annotated[Path, typer.Option(help="YAML config: models, engines, registry, token log, recovery, admission")],
    port: Annotated[Optional[int], typer.Option(help="Overrides the config's port")] = None,
    host: Annotated[Optional[str], typer.Option()] = None,
    replica_id: Annotated[Optional[str], typer.Option(help="Names this replica in stream ownership and logs")] = None,
    log_level: Annotated[Optional[str], typer.Option()] = None,
) -> None:
    """Serve the OpenAI-compatible gateway that keeps streams alive through engine crashes."""
    import uvicorn
    from pydantic import ValidationError

    from gateway.app import create_app
    from gateway.settings import GatewaySettings
    from common.logs import configure_logging

    if not config.exists():
        raise typer.BadParameter(f"{config} does not exist", param_hint="--config")
    try:
        settings = GatewaySettings.load(config, port=port, host=host, replica_id=replica_id, log_level=log_level)
    except (ValidationError, ValueError) as exc:
        raise typer.BadParameter(f"{config}: {exc}", param_hint="--config") from None
    configure_logging(settings.log_level, component="gateway")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning", access_log=False)
