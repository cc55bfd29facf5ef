"""Which engines a drill ran against and how they sample: the evidence the SLO document's "kept" text rests on.

A continuation after a migration is token-identical only where the engine
samples by position (`contract.sampling`): the reference engine always;
stock vLLM only with Lifeline's logits processor `lifeline_vllm` loaded,
which it says by refusing `identify_request` naming `SAMPLER_ID`. Greedy
decoding is identical on either (same weights, same prefix). The runner
records this before the fault, while every engine answers, into the run's
report (`engines`):

    {"instances": {id: {"engine": "reference"|"vllm", "sampling": "position_keyed"|"engine_default"|null}},
     "engines": ["reference", …], "sampling": the weakest seen, or null when one could not be asked}

An engine that does not answer the question is `null`, never assumed.

`instance_generation` reads the faulted instance's generation the same way,
for the run's events: the reference engine reports it
(`GET /healthz/generation`); stock vLLM has no such endpoint, so None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import httpx

from contract.identity import EngineIdentity
from contract.sampling import Sampling, identify_request, sampling_from_answer

Post = Callable[..., Any]


def sampling_of(engine: str, *, url: str, served_model: str, post: Post = httpx.post) -> str | None:
    """The engine's sampler: the reference engine is position-keyed by construction; vLLM is asked."""
    if engine == "reference":
        return Sampling.POSITION_KEYED.value
    try:
        answer = post(f"{url.rstrip('/')}/v1/completions", json=identify_request(served_model), timeout=10.0)
    except httpx.HTTPError:
        return None
    if answer.status_code >= 500:
        return None
    return sampling_from_answer(answer.status_code, answer.text).value


def evidence(fleet: Any, instance_ids: Sequence[str], *, post: Post = httpx.post) -> dict[str, Any]:
    """What `instance_ids` of `fleet` are and how they sample (see the module docstring for the shape)."""
    engine_of = getattr(fleet, "engine_of", None)
    served = getattr(fleet, "served_model", None)
    instances: dict[str, dict[str, str | None]] = {}
    for instance_id in instance_ids:
        engine = engine_of(instance_id) if engine_of is not None else "reference"
        model = served(instance_id) if served is not None else ""
        instances[instance_id] = {"engine": engine, "sampling": sampling_of(
            engine, url=fleet.engine_url(instance_id), served_model=model, post=post)}
    samplings = {i["sampling"] for i in instances.values()}
    weakest: str | None
    if not instances or None in samplings:
        weakest = None
    elif Sampling.ENGINE_DEFAULT.value in samplings:
        weakest = Sampling.ENGINE_DEFAULT.value
    else:
        weakest = Sampling.POSITION_KEYED.value
    return {"instances": instances, "engines": sorted({str(i["engine"]) for i in instances.values()}),
            "sampling": weakest}


def instance_generation(fleet: Any, instance_id: str, *, get: Callable[..., Any] = httpx.get) -> int | None:
    """The generation `instance_id` serves under, as its engine reports it; None where it cannot say."""
    engine_of = getattr(fleet, "engine_of", None)
    if (engine_of(instance_id) if engine_of is not None else "reference") != "reference":
        return None
    try:
        answer = get(f"{fleet.engine_url(instance_id).rstrip('/')}/healthz/generation", timeout=5.0)
        answer.raise_for_status()
        return EngineIdentity.model_validate(answer.json()).generation
    except (httpx.HTTPError, ValueError):
        return None
