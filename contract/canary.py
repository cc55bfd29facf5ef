"""The canary: a short fixed prompt whose greedy output is recorded per weight version.

Recorded once from a verified instance (`record_from_engine`: `lifeline
catalog canary record` into the catalog, a stock vLLM too, or `lifeline
agent canary-record` into a file) and carried to agents either on the snapshot's
`VersionEntry.canary` or in a canary file. An agent sends the same prompt
(token ids, greedy, `ignore_eos`) and compares:

    token count     exactly `len(output_token_ids)`
    time to first   ≤ `max_ttft_s`
    output          the first `compare_tokens` ids equal the record (all of them when None)

On the reference engine (float64, batch-invariant) the comparison is exact.
An engine without batch-invariant kernels may differ late in the output
under a different batch; `compare_tokens` bounds the comparison to a prefix
that its kernels keep stable (a greedy prefix diverges only at a near-tie,
so a short prefix is stable and still catches corrupted weights, which
change the first token almost always).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from common.errors import LifelineError
from contract.identity import EngineIdentity, directory_weights_digest


class CanaryRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    prompt_token_ids: list[int] = Field(min_length=1, max_length=256)
    output_token_ids: list[int] = Field(min_length=1, max_length=256)
    max_ttft_s: float = Field(2.0, gt=0, description="time to first token the canary allows, seconds")
    compare_tokens: int | None = Field(None, ge=1, description="compare only this prefix (engines without "
                                                                "batch-invariant kernels); None: all")
    recorded_from: str | None = Field(None, max_length=200, description="instance id the record came from")

    @property
    def max_tokens(self) -> int:
        return len(self.output_token_ids)


class CanaryNotRecorded(LifelineError):
    """The engine would not give a record: unreachable, an error, or outputs that differ between runs."""

    status_code = 502
    error_type = "canary_not_recorded"


class CanarySource(BaseModel):
    """The engine a record came from, as the catalog checks it: the version it serves and the digest of its weights.

    `digest_from` says who hashed the weights: `engine`, the engine itself
    (the reference engine's `/healthz/generation`); `files`, the recorder, from
    the directory a stock vLLM was started from (its `/v1/models` `root`, or
    the one the operator named), which vLLM cannot report.
    """

    model_config = ConfigDict(frozen=True)

    instance: str  # the engine's instance id; a stock vLLM's URL
    model: str  # the served model name: the version
    weights_digest: str
    digest_from: Literal["engine", "files"]


async def record_from_engine(client: httpx.AsyncClient, url: str, prompt_token_ids: list[int], *, max_tokens: int,
                             max_ttft_s: float, compare_tokens: int | None = None, runs: int = 2,
                             weights_dir: Path | None = None) -> tuple[CanarySource, CanaryRecord]:
    """Who the engine is and its greedy output for the prompt, the same in each of `runs` runs.

    The one way a record is made for the catalog (`lifeline catalog canary
    record`) and from a reference engine for an agent's file (`lifeline agent
    canary-record`). Two runs, because a record an engine does not reproduce
    on its own would eject every healthy instance: an engine without
    batch-invariant kernels needs `compare_tokens`, and this is how the
    operator finds out. Whether the engine is a *verified* one (its weights
    digest is the catalog's) is the catalog's to check, from the source
    returned. Stock vLLM has no `/healthz/generation`: its source is
    `stock_vllm_source` (the files hashed here).
    """
    url = url.rstrip("/")
    try:
        answer = await client.get(f"{url}/healthz/generation")
        if answer.status_code == 404:
            source = await stock_vllm_source(client, url, weights_dir=weights_dir)
        elif not answer.is_success:
            raise CanaryNotRecorded(f"{url}/healthz/generation answered {answer.status_code}")
        else:
            identity = EngineIdentity.model_validate_json(answer.content)
            source = CanarySource(instance=identity.instance_id, model=identity.model,
                                  weights_digest=identity.weights_digest, digest_from="engine")
    except httpx.TransportError as exc:
        raise CanaryNotRecorded(f"{url}: {type(exc).__name__}: {str(exc)[:200]}") from None
    except ValueError as exc:  # not an identity
        raise CanaryNotRecorded(f"{url}: not an engine's answer: {str(exc)[:200]}") from None
    record = await record_from_completions(client, url, prompt_token_ids, model=source.model, max_tokens=max_tokens,
                                           max_ttft_s=max_ttft_s, compare_tokens=compare_tokens, runs=runs,
                                           recorded_from=source.instance)
    return source, record


async def stock_vllm_source(client: httpx.AsyncClient, url: str, *, weights_dir: Path | None = None) -> CanarySource:
    """A stock vLLM as a canary source: the one model its `/v1/models` lists (its `--served-model-name`) and the
    weights digest of the directory it was started from (`root`), or of `weights_dir`, hashed here.

    vLLM cannot say which bytes it loaded, so the recorder reads the files: the directory must be readable
    where the record is made (the same host or volume), and `weights_dir` names it where `root` is another
    machine's path. What it proves is what vLLM was pointed at; the agents' canary checks what it computes.
    """
    answer = await client.get(f"{url}/v1/models")
    try:
        models = answer.raise_for_status().json()["data"]
        [served] = models
        name, root = str(served["id"]), served.get("root")
    except (httpx.HTTPStatusError, ValueError, KeyError, TypeError) as exc:
        raise CanaryNotRecorded(f"{url} has no /healthz/generation and /v1/models does not name exactly one model "
                                f"({str(exc)[:200]}): not an engine a canary can be recorded from") from None
    directory = weights_dir or (Path(root) if root else None)
    if directory is None or not directory.is_dir():
        raise CanaryNotRecorded(f"{url} is stock vLLM serving {name!r} from {root!r}, which is not a directory here: "
                                "name the directory it loaded with --weights-dir, so its files can be hashed")
    digest = await asyncio.to_thread(directory_weights_digest, directory)
    return CanarySource(instance=url, model=name, weights_digest=digest, digest_from="files")


async def record_from_completions(client: httpx.AsyncClient, url: str, prompt_token_ids: list[int], *, model: str,
                                  max_tokens: int, max_ttft_s: float, compare_tokens: int | None = None,
                                  runs: int = 2, recorded_from: str | None = None) -> CanaryRecord:
    """The greedy output of `model` at `url` for the prompt, through the OpenAI API alone, the same in each run.

    `/v1/completions` with the prompt as token ids and `return_token_ids: true`
    (vLLM ≥ 0.10.2 answers `choices[].token_ids`; the reference engine too). For
    stock vLLM the identity is the agent's: the served model name is the
    weight version, and nothing here can check which bytes it loaded.
    """
    url = url.rstrip("/")
    try:
        outputs = []
        for _ in range(max(1, runs)):
            response = await client.post(f"{url}/v1/completions", json={
                "model": model, "prompt": prompt_token_ids, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True})
            if not response.is_success:
                raise CanaryNotRecorded(f"{url}/v1/completions answered {response.status_code}: {response.text[:200]}")
            ids = response.json()["choices"][0].get("token_ids")
            if ids is None:
                raise CanaryNotRecorded(f"{url}/v1/completions gave no choices[].token_ids for return_token_ids: "
                                        "the engine cannot be canaried (vLLM >= 0.10.2 returns them)")
            outputs.append([int(t) for t in ids])
    except httpx.TransportError as exc:
        raise CanaryNotRecorded(f"{url}: {type(exc).__name__}: {str(exc)[:200]}") from None
    except (ValueError, KeyError, IndexError, TypeError) as exc:  # not a completion
        raise CanaryNotRecorded(f"{url}: not an engine's answer: {str(exc)[:200]}") from None
    output = outputs[0]
    if len(output) != max_tokens:
        raise CanaryNotRecorded(f"the engine gave {len(output)} tokens for max_tokens={max_tokens} with ignore_eos")
    compared = compare_tokens or len(output)
    for other in outputs[1:]:
        if other[:compared] != output[:compared]:
            first = next(i for i, (a, b) in enumerate(zip(output, other, strict=True)) if a != b)
            raise CanaryNotRecorded(f"the engine's greedy output differs between runs at token {first}: it is not "
                                    f"deterministic for this prompt; compare a shorter prefix (compare_tokens ≤ "
                                    f"{first}) or choose a prompt with a clear argmax")
    return CanaryRecord(prompt_token_ids=prompt_token_ids, output_token_ids=output, max_ttft_s=max_ttft_s,
                        compare_tokens=compare_tokens, recorded_from=recorded_from)
