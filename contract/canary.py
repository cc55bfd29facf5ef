"""The canary: a short fixed prompt whose greedy output is recorded per weight version.

Recorded once from a verified instance (`lifeline agent canary-record`, or
the catalog's own recorder) and carried to agents either on the snapshot's
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

from pydantic import BaseModel, ConfigDict, Field


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
