"""`lifeline pool …` (the capacity plan) and `lifeline agent …` (the regional agent).

Heavy imports happen inside the commands, so `lifeline --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

if TYPE_CHECKING:
    from warm_pool.settings import PoolSettings

pool_app = typer.Typer(no_args_is_help=True, add_completion=False)
agent_app = typer.Typer(no_args_is_help=True, add_completion=False)


@pool_app.callback()
def pool() -> None:
    """Warm pools sized for the loss of a zone."""


@pool_app.command("plan")
def plan_command(
    region: Annotated[str, typer.Option(help="the region the plan is for")],
    zones: Annotated[str, typer.Option(help="comma-separated zones of the region")],
    demand_seqs: Annotated[float, typer.Option(help="peak concurrent sequences in the region")],
    demand_tokens_per_s: Annotated[float, typer.Option(help="peak output tokens/s in the region")],
    context_tokens: Annotated[float, typer.Option(help="mean prompt + committed tokens per in-flight sequence")],
    instance_seqs: Annotated[int, typer.Option(help="concurrent sequences one instance serves at the latency target")],
    instance_tokens_per_s: Annotated[float, typer.Option(help="output tokens/s one instance sustains")],
    instance_prefill_tokens_per_s: Annotated[float, typer.Option(help="prompt tokens/s one instance prefills")],
    headroom: Annotated[float, typer.Option(help="multiplier on demand, ≥ 1")] = 1.2,
    recovery_target_s: Annotated[float, typer.Option(help="seconds the lost zone's replay may take")] = 10.0,
    tier: Annotated[str, typer.Option(help="DR tier: hot, warm or cold")] = "warm",
    previous_version_share: Annotated[float, typer.Option(help="extra warm on the previous version, share of warm")] = 0.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
) -> None:
    """Serving and warm instances per zone so the region survives losing its largest zone; with the arithmetic."""
    from pydantic import ValidationError

    from contract.pool_plan import PlanInputs
    from warm_pool.capacity import PlanError, plan_inputs
    from warm_pool.render import plan_json, print_plan

    try:
        inputs = PlanInputs(
            region=region, zones=zones, demand_seqs=demand_seqs, demand_tokens_per_s=demand_tokens_per_s,
            context_tokens=context_tokens, instance_seqs=instance_seqs, instance_tokens_per_s=instance_tokens_per_s,
            instance_prefill_tokens_per_s=instance_prefill_tokens_per_s, headroom=headroom,
            recovery_target_s=recovery_target_s, tier=tier, previous_version_share=previous_version_share)
        result = plan_inputs(inputs)  # the function /api/v1/pool/plan runs
    except (PlanError, ValidationError) as exc:
        raise typer.BadParameter(str(exc)) from None
    if as_json:
        typer.echo(json.dumps(plan_json(result), indent=2))
    else:
        print_plan(result)


@agent_app.command("serve")
def serve(
    region: Annotated[str, typer.Option(help="the region this agent watches")],
    config: Annotated[Optional[Path], typer.Option(help="agent YAML (settings; flags override it)")] = None,
    controlplane: Annotated[Optional[str], typer.Option(help="control plane URL (snapshot, events)")] = None,
    controlplane_token: Annotated[Optional[str], typer.Option(help="bearer token for the control plane")] = None,
    registry: Annotated[Optional[str], typer.Option(help="redis://… lease registry of the region")] = None,
    renew_leases_for: Annotated[Optional[str], typer.Option(help="url,… of engines that cannot renew their own leases")] = None,
    canary_file: Annotated[Optional[Path], typer.Option(help="JSON: weight version → recorded canary")] = None,
    probe_interval: Annotated[Optional[float], typer.Option(help="seconds between health probes of one instance")] = None,
    port: Annotated[Optional[int], typer.Option(help="port for /healthz and /metrics (0: none)")] = None,
    metrics_host: Annotated[Optional[str], typer.Option(help="address /metrics binds (default 127.0.0.1; "
                                                        "0.0.0.0 for a Prometheus outside the pod)")] = None,
) -> None:
    """Run the regional agent: probes, canaries, leases for stock engines, the warm pool."""
    import yaml
    from pydantic import ValidationError

    from common.logs import configure_logging
    from warm_pool.agent import run_agent
    from warm_pool.driver import PoolDriverError, build_driver
    from warm_pool.settings import AgentSettings

    values: dict = yaml.safe_load(config.read_text()) if config else {}
    flags = {"region": region, "controlplane_url": controlplane, "controlplane_token": controlplane_token,
             "registry": registry, "canary_file": canary_file, "probe_interval": probe_interval, "port": port,
             "metrics_host": metrics_host,
             "renew_leases_for": [u for u in renew_leases_for.split(",") if u] if renew_leases_for else None}
    values.update({k: v for k, v in flags.items() if v is not None})
    try:
        settings = AgentSettings(**values)
    except ValidationError as exc:
        raise typer.BadParameter(str(exc)) from None
    configure_logging(settings.log_level, component="agent")
    if settings.pool is not None:
        log_plan(settings.pool)
    try:
        driver = build_driver(settings.region, settings.pool) if settings.pool is not None else None
    except PoolDriverError as exc:
        raise typer.BadParameter(str(exc)) from None
    run_agent(settings, driver=driver)


def log_plan(pool: PoolSettings) -> None:
    """At start, the pool's tier and the arithmetic that sized it (docs/warm_pool.md): why it holds what it holds."""
    from common.logs import get_logger

    record = pool.plan_record
    if record is None:
        return
    get_logger(__name__).info("pool sized by its plan", model=pool.model, tier=str(record.tier),
                              zones={z.zone: [z.serving, z.warm, z.warm_previous] for z in record.zones},
                              survives_zone_loss=record.survives_zone_loss, replay_seconds=record.replay_seconds,
                              arithmetic=[f"{step.name}: {step.formula}" for step in record.arithmetic])


@agent_app.command("canary-record")
def canary_record(
    url: Annotated[str, typer.Option(help="a verified engine: its greedy output becomes the record")],
    out: Annotated[Path, typer.Option(help="the canary file to add the record to")],
    prompt_token_ids: Annotated[str, typer.Option(help="comma-separated prompt token ids")] = "1,2,3,4,5,6,7,8",
    max_tokens: Annotated[int, typer.Option(help="tokens the canary generates")] = 8,
    max_ttft_s: Annotated[float, typer.Option(help="time to first token the canary allows")] = 2.0,
    model: Annotated[Optional[str], typer.Option(help="stock vLLM: its served model name (the version); "
                                                  "default: the one model its /v1/models lists")] = None,
) -> None:
    """Record a canary from a verified engine into a canary file (version → record).

    The reference engine names its version on /healthz/generation; stock vLLM is recorded through
    /v1/completions alone, under its served model name.
    """
    import asyncio

    from warm_pool.probe import record_canary

    prompt = [int(t) for t in prompt_token_ids.split(",") if t.strip()]
    version, record = asyncio.run(record_canary(url, prompt, max_tokens=max_tokens, max_ttft_s=max_ttft_s,
                                                model=model))
    records = json.loads(out.read_text()) if out.exists() else {}
    records[version] = record.model_dump(mode="json")
    out.write_text(json.dumps(records, indent=2) + "\n")
    typer.echo(f"recorded the canary of {version}: {record.output_token_ids}")
