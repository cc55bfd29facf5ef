"""`lifeline engine …` and `lifeline model …` sub-commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

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


@engine_app.command("serve")
def serve(
    model: Annotated[Path, typer.Option(help="Model directory (from `lifeline model build`)")],
    port: Annotated[int, typer.Option()] = 8000,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    instance_id: Annotated[str, typer.Option()] = "engine-0",
    zone: Annotated[str, typer.Option()] = "local-a",
    region: Annotated[str, typer.Option()] = "local",
    served_model_name: Annotated[Optional[str], typer.Option(help="Name clients use; defaults to the directory name")] = None,
    state_dir: Annotated[Optional[Path], typer.Option(help="Where the boot generation counter lives")] = None,
    dtype: Annotated[str, typer.Option(help="float64 (exact resume) or float32 (faster)")] = "float64",
    max_num_seqs: Annotated[int, typer.Option(help="Sequences decoded together")] = 64,
    max_prefill_tokens: Annotated[int, typer.Option(help="Prompt tokens prefilled per step before decoding")] = 2048,
    torch_threads: Annotated[Optional[int], typer.Option()] = None,
    enable_fault_admin: Annotated[bool, typer.Option(help="Expose POST /admin/faults")] = False,
    fault_exit_after_tokens: Annotated[Optional[int], typer.Option(help="Exit abruptly after N tokens sent")] = None,
    fault_hang_after_tokens: Annotated[Optional[int], typer.Option(help="Stop sending after N tokens")] = None,
    fault_token_delay_ms: Annotated[float, typer.Option(help="Delay every token")] = 0.0,
    fault_first_token_delay_ms: Annotated[float, typer.Option(help="Delay the first token")] = 0.0,
    fault_fail_next_requests: Annotated[int, typer.Option(help="Answer the next K requests with 500")] = 0,
    fault_corrupt_weights: Annotated[bool, typer.Option(help="Corrupt weights in memory after load")] = False,
    log_level: Annotated[str, typer.Option()] = "info",
    registry: Annotated[Optional[str], typer.Option(help="Lease registry: the gateway's URL or redis://…?key_prefix=…")] = None,
    registry_token: Annotated[Optional[str], typer.Option(help="Bearer token for the gateway's lease endpoint")] = None,
    advertise_url: Annotated[Optional[str], typer.Option(help="URL gateways use to reach this engine")] = None,
) -> None:
    """Serve vLLM's OpenAI-compatible API subset from a real torch model."""
    import uvicorn
    from pydantic import ValidationError

    from engine.server import create_app
    from engine.settings import EngineSettings, FaultSettings
    from common.logs import configure_logging

    configure_logging(log_level, component="engine")
    try:
        settings = EngineSettings(
            model=model, port=port, host=host, instance_id=instance_id, zone=zone, region=region,
            served_model_name=served_model_name, state_dir=state_dir, dtype=dtype,  # type: ignore[arg-type]
            max_num_seqs=max_num_seqs, max_prefill_tokens=max_prefill_tokens, torch_threads=torch_threads,
            enable_fault_admin=enable_fault_admin, log_level=log_level,
            registry=registry, registry_token=registry_token, advertise_url=advertise_url,
        )
        faults = FaultSettings(
            exit_after_tokens=fault_exit_after_tokens, hang_after_tokens=fault_hang_after_tokens,
            token_delay_ms=fault_token_delay_ms, first_token_delay_ms=fault_first_token_delay_ms,
            fail_next_requests=fault_fail_next_requests, corrupt_weights=fault_corrupt_weights,
        )
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    if not (model / "config.json").exists():
        raise typer.BadParameter(f"{model} holds no config.json; build one with `lifeline model build`", param_hint="--model")
    uvicorn.run(create_app(settings, faults), host=host, port=port, log_level="warning", access_log=False)
