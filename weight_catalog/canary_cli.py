"""`lifeline catalog canary record|inherit`: a version's canary, from verified instances (or another version).

Apart from `weight_catalog/cli.py` because `record` is the one catalog
command that talks to engines (over HTTP, before its unit of work) rather
than only to the database; `inherit` sits beside it as its other source.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from controlplane.cli_support import audited_command, cli_actor, fail, load_settings, read_only, run_mutation

canary_app = typer.Typer(no_args_is_help=True, add_completion=False,
                         help="A version's canary: a verified instance's greedy output, checked by the agents.")


@canary_app.command("record")
def canary_record(
    model: str,
    version: str,
    url: Annotated[list[str], typer.Option(help="A verified instance of VERSION (repeat for a quorum: all must "
                                                "agree): its greedy output becomes the record.")],
    prompt_token_ids: Annotated[str, typer.Option(help="Comma-separated prompt token ids.")] = "1,2,3,4,5,6,7,8",
    max_tokens: Annotated[int, typer.Option(min=1, max=256, help="Tokens the canary generates.")] = 8,
    max_ttft_s: Annotated[float, typer.Option(min=0.001, help="Time to first token the canary allows (s).")] = 2.0,
    compare_tokens: Annotated[int | None, typer.Option(
        min=1, help="Compare only this prefix (engines without batch-invariant kernels); default all.")] = None,
    replace: Annotated[bool, typer.Option(help="Replace the version's recorded canary.")] = False,
    timeout_s: Annotated[float, typer.Option(min=0.1, help="Per request to the engine (s).")] = 30.0,
    weights_dir: Annotated[Path | None, typer.Option(
        help="Stock vLLM only (it cannot report its weights digest): the directory it loaded, hashed here; "
             "default the `root` its /v1/models names.")] = None,
) -> None:
    """Record VERSION's canary from a verified instance into the catalog; the snapshot carries it to agents.

    Each engine must serve VERSION with the catalog's weights digest and give
    the same greedy output twice, and all engines the same output; anything
    else is refused and changes nothing. The digest covers the files an engine
    loaded, not its memory: two instances that agree are the check against one
    whose weights went bad after loading. A stock vLLM cannot report its
    digest: the files it was started from are hashed here instead.
    """
    import asyncio

    import httpx
    from pydantic import ValidationError

    from contract.canary import CanaryRecord, record_from_engine
    from weight_catalog import canary, service

    settings = load_settings()
    target = f"model:{model}/version:{version}"
    with audited_command(settings, action="catalog.canary.record", target=target):
        try:
            prompt = [int(t) for t in prompt_token_ids.split(",") if t.strip()]
            CanaryRecord(prompt_token_ids=prompt, output_token_ids=[0], max_ttft_s=max_ttft_s,
                         compare_tokens=compare_tokens)  # the record's bounds, before asking the engine
        except (ValueError, ValidationError) as exc:
            fail("invalid_request", f"--prompt-token-ids: {str(exc).splitlines()[0][:300]}", code=2)
        # Fail fast on a version the catalog does not have or an unverified engine, before generating.
        read_only(settings, lambda session: service.get_version_or_raise(session, model=model, version=version))

        async def ask() -> list:
            async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s))) as client:
                return [await record_from_engine(client, u, prompt, max_tokens=max_tokens, max_ttft_s=max_ttft_s,
                                                 compare_tokens=compare_tokens, weights_dir=weights_dir) for u in url]

        answers = asyncio.run(ask())
        record = canary.agreed([r for _, r in answers], [i.instance for i, _ in answers])
    stored = run_mutation(
        settings, action="catalog.canary.record", target=target,
        work=lambda session, clock: canary.record(session, model=model, version=version, canary=record,
                                                  engines=[i for i, _ in answers], actor=cli_actor(), clock=clock,
                                                  replace=replace))
    typer.echo(f"recorded the canary of {model} {version} from {', '.join(i.instance for i, _ in answers)}: "
               f"{record.output_token_ids} (at {stored.canary_recorded_at.isoformat() if stored.canary_recorded_at else '?'})")


@canary_app.command("inherit")
def canary_inherit(
    model: str,
    version: str,
    from_version: Annotated[str, typer.Option("--from", help="The known-good version whose canary VERSION must "
                                                             "answer alike (same semantic fingerprint).")],
    replace: Annotated[bool, typer.Option(help="Replace the version's recorded canary.")] = False,
) -> None:
    """Give VERSION the canary of --from: it must answer as that version does (the same weights re-exported).

    What the agents then check VERSION's instances against is the known-good
    answer, not the new artifact's own; a re-export that changed the output
    fails its canary on the first instance that serves it.
    """
    from weight_catalog import canary

    settings = load_settings()
    stored = run_mutation(
        settings, action="catalog.canary.inherit", target=f"model:{model}/version:{version}",
        work=lambda session, clock: canary.inherit(session, model=model, version=version, from_version=from_version,
                                                   actor=cli_actor(), clock=clock, replace=replace))
    record = canary.canary_of(stored)
    typer.echo(f"{model} {version} inherits the canary of {from_version}: "
               f"{record.output_token_ids if record else '?'}")
