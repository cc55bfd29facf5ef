"""The wire records between the memory holder (`holder/`) and its tenants (engines).

Defined once here so the holder and `engine/holder_client.py` import the same
shapes and neither imports the other. A tenant attaches with its instance id
and boot generation and gets a `WeightsDescription`: enough to map every
tensor from the holder's region file without copying (file path, offset,
dtype, shape), plus the region's epoch and checksum so a tenant can tell one
sealed region from the next.

Promise: service recovery. A restarted engine re-maps weights another process
kept alive instead of reading them from disk; it promises nothing about the
requests the dead engine had in flight (the gateway continues those).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# numpy dtype names the holder stores; the engine computes in float64 or float32.
HOLDER_DTYPES = ("float64", "float32")
# Every tensor starts at a multiple of this inside a region (cache line, and SIMD loads).
TENSOR_ALIGNMENT = 64


class TenantState(StrEnum):
    """Stored states. "frozen" is never stored: it is an attached or taking-over tenant
    whose lease has expired, computed when read (`TenantView.frozen`)."""

    ATTACHED = "attached"
    TAKING_OVER = "taking_over"  # a newer generation attached; old blocks frozen until it confirms
    RELEASED = "released"


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    dtype: str
    shape: list[int]
    offset: int = Field(ge=0, description="bytes from the start of the region file")
    nbytes: int = Field(ge=0)


class RegionView(BaseModel):
    """One sealed region: a file in shared memory that the holder owns and tenants map."""

    model_config = ConfigDict(extra="forbid")

    region_id: int
    path: str
    size: int
    purpose: str  # "weights" (later "kv")
    owner: str  # "holder" for shared read-only weights, else a tenant id
    epoch: int  # the holder boot that sealed it
    checksum: str  # "sha256:…" of the whole file
    tensors: list[TensorSpec]


# Where the holder keeps the weights tenants compute on: "cpu" (the region file itself) or a CUDA device.
DEVICE_PATTERN = r"^(cpu|cuda(:[0-9]+)?)$"


def normalize_device(device: str) -> str:
    """'cpu', or 'cuda:N' ('cuda' is device 0); ValueError for anything else."""
    if not re.fullmatch(DEVICE_PATTERN, device):
        raise ValueError(f"device {device!r} is not 'cpu', 'cuda' or 'cuda:N'")
    return "cuda:0" if device == "cuda" else device


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode("ascii")


def _unb64(value: str | None) -> bytes | None:
    return None if value is None else base64.b64decode(value, validate=True)


class CudaIpcHandle(BaseModel):
    """A CUDA allocation exported by the holder: the fields of torch's `UntypedStorage._share_cuda_()`.

    The tenant hands them back to `UntypedStorage._new_shared_cuda(*handle.share_args())`,
    which opens the allocation (`cudaIpcOpenMemHandle`) in its own process: a view of the
    holder's device memory, nothing copied. Bytes travel base64-encoded; `share_args` gives
    back exactly the tuple `_share_cuda_` returned (tested on CPU, tests/unit/holder).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_index: int = Field(ge=0)
    handle: str  # base64 of the cudaIpcMemHandle_t bytes
    storage_size_bytes: int = Field(ge=0)
    storage_offset_bytes: int = Field(ge=0)
    ref_counter_handle: str  # base64 of the name of torch's shared reference counter
    ref_counter_offset: int = Field(ge=0)
    event_handle: str | None  # base64 of the cudaIpcEventHandle_t, when the producer recorded one
    event_sync_required: bool

    @classmethod
    def from_share_args(cls, args: tuple[Any, ...]) -> CudaIpcHandle:
        device, handle, size, offset, ref_handle, ref_offset, event_handle, event_sync = args
        return cls(device_index=int(device), handle=_b64(handle), storage_size_bytes=int(size),
                   storage_offset_bytes=int(offset), ref_counter_handle=_b64(ref_handle),
                   ref_counter_offset=int(ref_offset), event_handle=_b64(event_handle),
                   event_sync_required=bool(event_sync))

    def share_args(self) -> tuple[Any, ...]:
        return (self.device_index, _unb64(self.handle), self.storage_size_bytes, self.storage_offset_bytes,
                _unb64(self.ref_counter_handle), self.ref_counter_offset, _unb64(self.event_handle),
                self.event_sync_required)


class DeviceCopy(BaseModel):
    """The sealed region's bytes on a CUDA device, same layout (the region's `TensorSpec` offsets).

    Not in the ledger: a device allocation dies with the holder process, so a
    restarted holder uploads again from the region file it adopted (checked
    against its seal), never from unverified device memory.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: str = Field(pattern=DEVICE_PATTERN)
    size: int = Field(ge=0)  # = region.size
    region_checksum: str  # the seal of the region file it was copied from
    ipc: CudaIpcHandle


class WeightsDescription(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_dir: str
    weights_digest: str  # contract.identity.weights_digest of the shards it was loaded from
    config_sha256: str  # of config.json: a tenant refuses weights for another architecture
    dtype: str
    region: RegionView
    device_copy: DeviceCopy | None = None  # with the holder's `device: cuda[:N]`: open it through CUDA IPC


class AttachRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")
    generation: int = Field(ge=0)


class GenerationBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generation: int = Field(ge=0)


class TenantView(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant_id: str
    generation: int
    state: TenantState
    frozen: bool  # lease expired: its blocks are kept for a successor, never reused
    lease_expires_in_s: float
    takeovers: int


# How a block's tensor is laid out: [k|v, layer, kv head, position in block, head dim]. A second layout
# (vLLM's paged [num_blocks, 2, block, heads, dim], say) gets a new name and so a new root: a miss.
KV_ORDER = "kv.layer.kv_head.token.head_dim"
# How positions are encoded: rotate-half ("neox") RoPE over the whole head, no scaling.
ROPE_STYLE = "neox-rotate-half"


class KVLayout(BaseModel):
    """One KV block: keys and values of `block_tokens` positions for every layer,
    shaped [2, num_layers, num_kv_heads, block_tokens, head_dim] in `dtype`, and the
    position encoding those keys were rotated with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    block_tokens: int = Field(ge=1)
    num_layers: int
    num_heads: int  # query heads: with num_kv_heads, the attention geometry a block was computed under
    num_kv_heads: int
    head_dim: int
    dtype: str
    kv_order: str = Field(KV_ORDER, description="axis order of a block's tensor")
    rope_theta: float  # position encoding: a block is only valid under the same one
    rope_style: str = Field(ROPE_STYLE, description="rotation convention and scaling of the position encoding")

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (2, self.num_layers, self.num_kv_heads, self.block_tokens, self.head_dim)

    @property
    def block_bytes(self) -> int:
        itemsize = {"float64": 8, "float32": 4}[self.dtype]
        return 2 * self.num_layers * self.num_kv_heads * self.block_tokens * self.head_dim * itemsize


def kv_layout_from_config(config: dict, *, block_tokens: int, dtype: str, kv_order: str = KV_ORDER) -> KVLayout:
    """The layout a model's `config.json` implies: the holder and the engine derive it the same way."""
    heads = config["num_attention_heads"]
    rope_theta = config.get("rope_theta") or config.get("rope_parameters", {}).get("rope_theta", 10000.0)
    scaling = config.get("rope_scaling")
    style = ROPE_STYLE if not scaling else f"{ROPE_STYLE}+{json.dumps(scaling, sort_keys=True)}"
    return KVLayout(block_tokens=block_tokens, num_layers=config["num_hidden_layers"], num_heads=heads,
                    num_kv_heads=config.get("num_key_value_heads", heads),
                    head_dim=config.get("head_dim") or config["hidden_size"] // heads, dtype=dtype,
                    kv_order=kv_order, rope_theta=float(rope_theta), rope_style=style)


def tokenizer_digest(tokenizer_json: bytes | None) -> str:
    """sha256 of `tokenizer.json`: the same ids under another vocabulary are other tokens."""
    return "sha256:" + hashlib.sha256(tokenizer_json if tokenizer_json is not None else b"<no tokenizer>").hexdigest()


class KVValidity(BaseModel):
    """The validity tuple: everything a block's keys and values depend on besides its tokens.

    It roots every block hash chain (`kv_root_hash`), so two engines share a block only if
    every field is equal; any difference (another weight version, tokenizer, dtype, block
    size, geometry, position encoding) gives another root and so a miss, never a misuse
    (invariant 6). Carried whole in every checkpoint manifest (`contract.kv_checkpoint`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    weights_digest: str  # contract.identity.weights_digest: the weights' content, not their name
    tokenizer_digest: str
    layout: KVLayout

    def mismatches(self, other: KVValidity) -> list[str]:
        """The fields on which `other` differs from this tuple (for a refusal's message)."""
        mine, theirs = self.model_dump(), other.model_dump()
        differ = [k for k in ("weights_digest", "tokenizer_digest") if mine[k] != theirs[k]]
        return differ + [f"layout.{k}" for k in mine["layout"] if mine["layout"][k] != theirs["layout"].get(k)]


def engine_validity(model_dir: Path, weights_digest: str, *, block_tokens: int, dtype: str,
                    kv_order: str = KV_ORDER) -> KVValidity:
    """An engine's validity tuple: its weights' content, tokenizer, dtype, block size, geometry, RoPE, and how
    its blocks' bytes are laid out (`kv_order`: the reference engine's axis order, or an engine's own layout).

    One derivation for every engine kind (the reference engine, stock vLLM through `lifeline_vllm.kv_connector`,
    the holder): two engines share checkpoints exactly when this gives them the same tuple."""
    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = model_dir / "tokenizer.json"
    return KVValidity(weights_digest=weights_digest,
                      tokenizer_digest=tokenizer_digest(tokenizer.read_bytes() if tokenizer.exists() else None),
                      layout=kv_layout_from_config(config, block_tokens=block_tokens, dtype=dtype, kv_order=kv_order))


def kv_root_hash(validity: KVValidity) -> str:
    """The chain's root: a block hash binds the whole validity tuple (invariant 6)."""
    material = json.dumps(validity.model_dump(), sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def kv_block_hash(parent_hash: str, token_ids: list[int]) -> str:
    """The hash of a block: its parent's hash and its own token ids, so it names the whole prefix."""
    return hashlib.sha256(f"{parent_hash}:{','.join(map(str, token_ids))}".encode()).hexdigest()


def kv_chain_hashes(root_hash: str, token_ids: list[int], block_tokens: int) -> list[str]:
    """The hash of every full block of a prefix, in order: computable from the tokens alone."""
    hashes, parent = [], root_hash
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        parent = kv_block_hash(parent, token_ids[start:start + block_tokens])
        hashes.append(parent)
    return hashes


def kv_block_checksum(data: bytes | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class KVPoolDescription(BaseModel):
    model_config = ConfigDict(extra="forbid")

    region: RegionView  # purpose "kv"; block i starts at i * layout.block_bytes
    validity: KVValidity
    num_blocks: int
    root_hash: str  # kv_root_hash(validity)

    @property
    def layout(self) -> KVLayout:
        return self.validity.layout


class AttachResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    holder_epoch: int
    tenant: TenantView
    takeover: bool  # a newer generation took over a previous tenant's blocks
    heartbeat_interval_s: float
    lease_ttl_s: float
    weights: WeightsDescription
    kv: KVPoolDescription | None = None  # absent when the holder keeps no KV pool


class WeightsSnapshot(BaseModel):
    """What a primed standby maps before it is an engine (`GET /v1/weights/snapshot`): read without a tenancy.

    The holder boot (`holder_epoch`) travels with the description so that the
    engine the standby becomes can tell, at its attach, whether the region it
    primed is still the one this holder describes; any difference is a miss.
    """

    model_config = ConfigDict(extra="forbid")

    holder_epoch: int
    weights: WeightsDescription


class KVReserveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generation: int = Field(ge=0)
    count: int = Field(ge=1, le=4096)


class KVReserveResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    blocks: list[int]  # may be fewer than asked: the pool is full of committed or frozen blocks


class KVCommitRequest(BaseModel):
    """The tenant wrote a block's keys and values; the holder checksums and records it."""

    model_config = ConfigDict(extra="forbid")

    generation: int = Field(ge=0)
    block: int = Field(ge=0)
    parent_hash: str
    token_ids: list[int]


class KVBlockRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    block: int
    hash: str
    checksum: str


class KVCommitResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    committed: KVBlockRef  # another block, if the same prefix was already committed (this one is freed)


class KVLookupRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token_ids: list[int]


class KVLookupResponse(BaseModel):
    """The longest chain of committed blocks the ledger vouches for, from the root."""

    model_config = ConfigDict(extra="forbid")

    blocks: list[KVBlockRef]
    discarded: list[int]  # blocks found with contents that no longer match their checksum


class HeartbeatResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")

    holder_epoch: int
    tenant: TenantView


# Error types the holder answers with (common.errors shape).
SUPERSEDED_ERROR_TYPE = "tenant_superseded"  # 409: a newer generation holds this tenant id
UNKNOWN_TENANT_ERROR_TYPE = "unknown_tenant"  # 404
NOT_READY_ERROR_TYPE = "holder_not_ready"  # 503
