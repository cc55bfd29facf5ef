"""lifeline_vllm: Lifeline's plugins for stock vLLM, loaded by vLLM's own plugin interfaces (no fork).

`sampler.PositionKeyedSampler` is a vLLM logits processor
(`--logits-processors lifeline_vllm.sampler:PositionKeyedSampler`) that makes
vLLM sample seeded requests exactly as the reference engine does, so a
stream moved between engines continues token-identically. This package runs
inside vLLM's virtualenv: it imports torch, vLLM and `engine.sampling`
(pure torch), nothing else of Lifeline.
"""
