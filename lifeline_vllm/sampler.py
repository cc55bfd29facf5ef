"""Position-keyed sampling inside stock vLLM: a seeded stream continues identically after a move.

vLLM seeds one generator per request that advances with every token drawn,
so a continuation sent as `prompt ‖ committed` to another vLLM — seeded
again — draws other numbers from the first resumed token on. The reference
engine instead draws the token at absolute position `i` from a uniform keyed
by `(seed, i)` alone (`engine/sampling.py`), which a continuation reproduces.

This processor brings that rule into vLLM through its public plugin
interface (`vllm.v1.sample.logits_processor.LogitsProcessor`, loaded with
`--logits-processors lifeline_vllm.sampler:PositionKeyedSampler`). For every
request in the batch that has a `seed` and a temperature above zero it
picks the token with the reference engine's own `sample_token` from the
raw logits (temperature, top_k and top_p applied there, in float64, ties by
token id) and masks every other token to -inf. vLLM's sampler then has one
finite logit left and emits exactly that token, whatever its own
temperature, top-k/top-p or generator do. Greedy and unseeded requests are
left alone: the processor is declared not argmax-invariant only so that it
sees logits before vLLM's temperature scaling.

Discovery: a request with `vllm_xargs: {"lifeline_sampler": "identify"}`
is refused (HTTP 400) with a message naming `SAMPLER_ID`. A vLLM without
this processor ignores the unknown argument and answers 200, so the
regional agent can tell, through the OpenAI API alone, whether an engine
samples position-keyed (`contract/sampling.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from contract.sampling import IDENTIFY_ARG, IDENTIFY_VALUE, SAMPLER_ID
from engine.sampling import SamplingParams as PositionKeyedParams
from engine.sampling import sample_token

if TYPE_CHECKING:
    from vllm.config import VllmConfig

_EPS = 1e-5  # vLLM's own threshold below which a temperature means greedy


@dataclass
class _Row:
    params: PositionKeyedParams
    seed: int
    prompt_len: int
    output_ids: list[int]  # vLLM's live list of this request's generated tokens

    @property
    def position(self) -> int:
        """The absolute position of the token about to be drawn (prompt ‖ output so far)."""
        return self.prompt_len + len(self.output_ids)


class PositionKeyedSampler(LogitsProcessor):
    """Picks each seeded request's token by `(seed, absolute position)`; see the module docstring."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        extra: dict[str, Any] = sampling_params.extra_args or {}
        if extra.get(IDENTIFY_ARG) == IDENTIFY_VALUE:
            raise ValueError(f"{IDENTIFY_ARG}: this engine samples with {SAMPLER_ID}")

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _Row] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # it must see the logits before vLLM applies temperature

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, params, prompt_ids, output_ids in batch_update.added:
            row = _row(params, prompt_ids, output_ids)
            if row is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = row
        for first, second, direction in batch_update.moved:
            a, b = self.rows.pop(first, None), self.rows.pop(second, None)
            if a is not None:
                self.rows[second] = a
            if direction is MoveDirectionality.SWAP and b is not None:
                self.rows[first] = b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, row in self.rows.items():
            token = sample_token(logits[index], row.params, row.seed, row.position)
            logits[index].fill_(float("-inf"))
            logits[index, token] = 0.0
        return logits


def _row(params: SamplingParams, prompt_ids: list[int] | None, output_ids: list[int]) -> _Row | None:
    if params.seed is None or params.temperature < _EPS or prompt_ids is None:
        return None
    top_k = params.top_k if params.top_k and params.top_k > 0 else -1
    return _Row(PositionKeyedParams(temperature=params.temperature, top_p=params.top_p, top_k=top_k, seed=params.seed),
                params.seed, len(prompt_ids), output_ids)
