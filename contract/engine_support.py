"""What an engine must do for Lifeline to serve streams through it, and the oldest vLLM that does it.

Recovery continues a stream from the tokens the gateway committed, so every
streamed chunk must say which token ids it carries: vLLM's
`return_token_ids` request field (vLLM 0.10.2 and later). An engine that
answers with text but no ids cannot say what it committed; the gateway
ejects it and refuses the request with `engine_incompatible` rather than
guess, and the regional agent can refuse such an engine its lease. One
constant for both sides (`lifeline/vllm.py` may import it from here).
"""

from __future__ import annotations

MIN_VLLM_VERSION = "0.10.2"  # the first vLLM whose streamed chunks carry `token_ids` when asked (`return_token_ids`)
TOKEN_IDS_FIELD = "return_token_ids"
INCOMPATIBLE_ERROR_TYPE = "engine_incompatible"


def missing_token_ids(engine: str) -> str:
    """The sentence that says why `engine` cannot serve streams, and what to run instead."""
    return (f"{engine} streams output without per-token ids: it does not honour `{TOKEN_IDS_FIELD}`, so the gateway "
            f"cannot tell which tokens it committed; run vLLM {MIN_VLLM_VERSION} or later (or an engine that "
            f"returns `token_ids` in every streamed chunk)")
