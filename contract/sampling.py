"""How an engine samples seeded requests, and how to ask it: one record both planes read.

`position_keyed`: the token at absolute position `i` is drawn from a uniform
keyed by `(seed, i)` alone, so a stream moved as `prompt ‖ committed` to
another such engine continues token-identically (the reference engine
always; stock vLLM with Lifeline's logits processor `lifeline_vllm.sampler`).
`engine_default`: the engine's own sampler (stock vLLM seeds one generator
per request); a sampled stream moved to another engine continues, but may
differ from the first resumed token on.

The question is asked through the OpenAI API alone: a completion request
carrying `vllm_xargs: {IDENTIFY_ARG: IDENTIFY_VALUE}` is refused with a 400
naming `SAMPLER_ID` by an engine that samples position-keyed (vLLM with the
processor, the reference engine), and answered by one that does not (vLLM
keeps unknown extra arguments without a word).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Sampling(StrEnum):
    POSITION_KEYED = "position_keyed"
    ENGINE_DEFAULT = "engine_default"


SAMPLER_ID = "lifeline position_keyed sampler v1"
IDENTIFY_ARG = "lifeline_sampler"
IDENTIFY_VALUE = "identify"


def identify_request(model: str) -> dict[str, Any]:
    """The `/v1/completions` body that asks an engine which sampler it runs (one token, never decoded)."""
    return {"model": model, "prompt": [0], "max_tokens": 1, "temperature": 0.0,
            "vllm_xargs": {IDENTIFY_ARG: IDENTIFY_VALUE}}


def sampling_from_answer(status_code: int, body: str) -> Sampling:
    """What the answer to `identify_request` says: position_keyed only when refused naming `SAMPLER_ID`."""
    return Sampling.POSITION_KEYED if status_code == 400 and SAMPLER_ID in body else Sampling.ENGINE_DEFAULT
