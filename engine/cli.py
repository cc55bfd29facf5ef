"""`lifeline engine …` and `lifeline model …` sub-commands.

`engine serve` passes to `EngineSettings` only the flags the user gave: typer
would otherwise hand over every default explicitly, and pydantic-settings
ranks init arguments above the environment, so `LIFELINE_ENGINE_PORT=9123`
used to give 8000. Defaults live once, in `engine/settings.py`; the help text
reads them from there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from pydantic import BaseModel

from engine.settings import EngineSettings, FaultSettings

engine_app = typer.Typer(no_args_is_help=True, add_completion=False)
model_app = typer.Typer(no_args_is_help=True, add_completion=False)


@model_app.command("build")
def build(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model into")],
    preset: Annotated[str, typer.Option(help="tiny (~5M parameters) or small (~100M)")] = "tiny",
    seed: Annotated[int, typer.Option(help="Weight seed; same preset and seed give identical files")] = 0,
) -> None:
    """Build a deterministic LLaMA-style model: sharded safetensors, BPE tokenizer, chat template."""
    from engine.model_build import build_model
    from engine.presets import PRESETS

    if preset not in PRESETS:
        raise typer.BadParameter(f"choose one of {sorted(PRESETS)}", param_hint="--preset")
    if seed < 0:
        raise typer.BadParameter("must be non-negative", param_hint="--seed")
    build_model(out_dir, preset_name=preset, seed=seed)
    typer.echo(f"built {preset} model (seed {seed}) in {out_dir}")


def _opt(settings: type[BaseModel], field: str, prefix: str = "") -> Any:
    """A typer option whose help names the settings default and environment variable."""
    info = settings.model_fields[field]
    env = f"{settings.model_config.get('env_prefix', '')}{field}".upper()
    default = "required" if info.is_required() else f"default: {info.default}"
    return typer.Option(f"--{prefix}{field.replace('_', '-')}", help=f"{info.description or ''} [{default}; env {env}]",
                        show_default=False)


def _given(values: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


E, F = EngineSettings, FaultSettings


@engine_app.command("serve")
def serve(
    model: Annotated[Optional[Path], _opt(E, "model")] = None,
    port: Annotated[Optional[int], _opt(E, "port")] = None,
    host: Annotated[Optional[str], _opt(E, "host")] = None,
    instance_id: Annotated[Optional[str], _opt(E, "instance_id")] = None,
    zone: Annotated[Optional[str], _opt(E, "zone")] = None,
    region: Annotated[Optional[str], _opt(E, "region")] = None,
    served_model_name: Annotated[Optional[str], _opt(E, "served_model_name")] = None,
    state_dir: Annotated[Optional[Path], _opt(E, "state_dir")] = None,
    dtype: Annotated[Optional[str], _opt(E, "dtype")] = None,
    max_num_seqs: Annotated[Optional[int], _opt(E, "max_num_seqs")] = None,
    max_waiting: Annotated[Optional[int], _opt(E, "max_waiting")] = None,
    max_prefill_tokens: Annotated[Optional[int], _opt(E, "max_prefill_tokens")] = None,
    torch_threads: Annotated[Optional[int], _opt(E, "torch_threads")] = None,
    enable_fault_admin: Annotated[Optional[bool], _opt(E, "enable_fault_admin")] = None,
    log_level: Annotated[Optional[str], _opt(E, "log_level")] = None,
    registry: Annotated[Optional[str], _opt(E, "registry")] = None,
    registry_token: Annotated[Optional[str], _opt(E, "registry_token")] = None,
    advertise_url: Annotated[Optional[str], _opt(E, "advertise_url")] = None,
    holder: Annotated[Optional[str], _opt(E, "holder")] = None,
    kv_block_tokens: Annotated[Optional[int], _opt(E, "kv_block_tokens")] = None,
    kv_cache_blocks: Annotated[Optional[int], _opt(E, "kv_cache_blocks")] = None,
    kv_checkpoint_store: Annotated[Optional[str], _opt(E, "kv_checkpoint_store")] = None,
    kv_checkpoint_s3_endpoint_url: Annotated[Optional[str], _opt(E, "kv_checkpoint_s3_endpoint_url")] = None,
    kv_checkpoint_every: Annotated[Optional[int], _opt(E, "kv_checkpoint_every")] = None,
    enable_kv_admin: Annotated[Optional[bool], _opt(E, "enable_kv_admin")] = None,
    kv_import_max_bytes: Annotated[Optional[int], _opt(E, "kv_import_max_bytes")] = None,
    step_stall_bound: Annotated[Optional[float], _opt(E, "step_stall_bound")] = None,
    drain_unroute_wait: Annotated[Optional[float], _opt(E, "drain_unroute_wait")] = None,
    drain_timeout: Annotated[Optional[float], _opt(E, "drain_timeout")] = None,
    exit_after_tokens: Annotated[Optional[int], _opt(F, "exit_after_tokens", "fault-")] = None,
    hang_after_tokens: Annotated[Optional[int], _opt(F, "hang_after_tokens", "fault-")] = None,
    stall_step_after_tokens: Annotated[Optional[int], _opt(F, "stall_step_after_tokens", "fault-")] = None,
    token_delay_ms: Annotated[Optional[float], _opt(F, "token_delay_ms", "fault-")] = None,
    first_token_delay_ms: Annotated[Optional[float], _opt(F, "first_token_delay_ms", "fault-")] = None,
    fail_next_requests: Annotated[Optional[int], _opt(F, "fail_next_requests", "fault-")] = None,
    corrupt_weights: Annotated[Optional[bool], _opt(F, "corrupt_weights", "fault-")] = None,
) -> None:
    """Serve vLLM's OpenAI-compatible API subset from a real torch model."""
    given = _given(locals())  # first: only the parameters are local yet
    from pydantic import ValidationError

    fault_fields = set(FaultSettings.model_fields)
    try:
        settings = EngineSettings(**{k: v for k, v in given.items() if k not in fault_fields})
        faults = FaultSettings(**{k: v for k, v in given.items() if k in fault_fields})
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    if not (settings.model / "config.json").exists():
        raise typer.BadParameter(f"{settings.model} holds no config.json; build one with `lifeline model build`",
                                 param_hint="--model")
    from common.logs import configure_logging
    from engine import server

    configure_logging(settings.log_level, component="engine")
    server.run_server(settings, faults)
