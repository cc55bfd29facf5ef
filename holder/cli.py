"""`lifeline holder serve`: flags given override `LIFELINE_HOLDER_*`; defaults live in `holder/settings.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from holder.settings import HolderSettings

holder_app = typer.Typer(no_args_is_help=True, add_completion=False)


@holder_app.callback()
def _group() -> None:
    """Weight memory holder: weights that outlive the engine process."""


def _opt(field: str) -> Any:
    info = HolderSettings.model_fields[field]
    default = "required" if info.is_required() else f"default: {info.default}"
    return typer.Option(f"--{field.replace('_', '-')}", show_default=False,
                        help=f"{info.description or ''} [{default}; env LIFELINE_HOLDER_{field.upper()}]")


@holder_app.command("serve")
def serve(
    model: Annotated[Path | None, _opt("model")] = None,
    state_dir: Annotated[Path | None, _opt("state_dir")] = None,
    shm_dir: Annotated[Path | None, _opt("shm_dir")] = None,
    host: Annotated[str | None, _opt("host")] = None,
    port: Annotated[int | None, _opt("port")] = None,
    dtype: Annotated[str | None, _opt("dtype")] = None,
    lease_ttl: Annotated[float | None, _opt("lease_ttl")] = None,
    heartbeat_interval: Annotated[float | None, _opt("heartbeat_interval")] = None,
    kv_blocks: Annotated[int | None, _opt("kv_blocks")] = None,
    kv_block_tokens: Annotated[int | None, _opt("kv_block_tokens")] = None,
    device: Annotated[str | None, _opt("device")] = None,
    log_level: Annotated[str | None, _opt("log_level")] = None,
) -> None:
    """Hold a model's weights in shared memory for engines to attach to; keep a ledger of every allocation."""
    given = {name: value for name, value in locals().items() if value is not None}
    from pydantic import ValidationError

    try:
        settings = HolderSettings(**given)
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    if not (settings.model / "model.safetensors.index.json").exists():
        raise typer.BadParameter(f"{settings.model} holds no safetensors index; build one with `lifeline model build`",
                                 param_hint="--model")
    from common.logs import configure_logging
    from holder.app import run_server

    configure_logging(settings.log_level, component="holder")
    run_server(settings)


if __name__ == "__main__":  # pragma: no cover - `python -m holder.cli serve …` until `lifeline holder` is mounted
    holder_app()
