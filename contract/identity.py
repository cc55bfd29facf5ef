"""Engine identity: what `/healthz/generation` says, and the digest that ties it to the catalog.

Two different hashes, named so they cannot be confused:

- `weights_digest`: sha256 over the sha256 of every `*.safetensors` shard —
  *these bytes*. The engine computes it from its files; the catalog computes
  it from the shard digests it recorded at registration. Equal digests mean
  the engine serves exactly the registered weights.
- the catalog's semantic `fingerprint` — *this behaviour* (tokenizer, chat
  template, generation defaults, architecture); two versions with different
  weights can share it, and must, to be promoted over each other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from common.hashing import DirectorySource, hash_shards

WEIGHT_SUFFIX = ".safetensors"

# The error `type` an engine ends a request with when a planned shutdown cuts it
# short (an SSE error event mid-stream, a 503 body before it): the gateway
# migrates on it as on a crash, but the engine is healthy and chose to stop.
DRAINING_ERROR_TYPE = "engine_draining"


def directory_weights_digest(model_dir: Path, *, workers: int = 4) -> str:
    """`weights_digest` of the `*.safetensors` shards under `model_dir` (keyed by their path in it), hashed here:
    what an engine started from that directory serves, whatever the engine (the reference engine at start-up,
    the memory holder, the catalog's canary for a stock vLLM that cannot say it)."""
    shards = sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob(f"*{WEIGHT_SUFFIX}") if p.is_file())
    digests = hash_shards(DirectorySource(model_dir), shards, workers=workers)
    return weights_digest({d.path: d.sha256 for d in digests})


def weights_digest(file_sha256: Mapping[str, str]) -> str:
    """`sha256:` + sha256 of `"{path}:{sha256}\\n"` for each weight shard, in path order."""
    outer = hashlib.sha256()
    for path in sorted(p for p in file_sha256 if p.endswith(WEIGHT_SUFFIX)):
        outer.update(f"{path}:{file_sha256[path]}\n".encode())
    return "sha256:" + outer.hexdigest()


class EngineIdentity(BaseModel):
    """The body of `GET /healthz/generation` on the reference engine (and what the agent records for vLLM)."""

    model_config = ConfigDict(extra="ignore")

    instance_id: str
    generation: int  # the lease registry's, once registered; the boot counter before
    boot_generation: int
    model: str  # the served model name: the weight version
    weights_digest: str
    zone: str
    region: str
    started_at: float  # Unix seconds
