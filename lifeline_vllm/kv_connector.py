"""Lifeline's KV connector for stock vLLM: session checkpoints in Lifeline's store, loaded instead of computed.

Loaded by vLLM as any KV connector (no fork):

    --kv-transfer-config '{"kv_connector": "LifelineKVConnector", "kv_role": "kv_both",
        "kv_connector_module_path": "lifeline_vllm.kv_connector",
        "kv_connector_extra_config": {"store": "file:///var/lib/lifeline/kv", "weights_digest": "sha256:…"}}'

(`lifeline.vllm.kv_connector_args` builds it.) The store is any of `contract.kv_checkpoint`'s (a directory,
Redis, S3) and the records are its: blocks under `kv/<root>/blocks/<hash>.safetensors` (one tensor `kv`,
[2, layers, kv heads, block, head dim]) and a manifest per prefix, rooted in the validity tuple
`contract.holder.engine_validity` derives from the model directory, vLLM's dtype and block size. So the
control plane's replication and retention handle a vLLM's checkpoints as a reference engine's.

- **Save.** A request whose `kv_transfer_params` hold `{"lifeline_checkpoint": {…}}` is checkpointed when
  it finishes: every full block of what vLLM computed (prompt and output) is copied out of the paged cache
  in the step after, and a writer thread puts the blocks, then the manifest. The request's blocks are held
  only until the copy (`request_finished` → `get_finished`), never until the store answers.
- **Load.** For every request, the scheduler side looks for the longest checkpointed prefix of its prompt
  (the last prompt position is always computed: its logits pick the next token), reads its manifest and
  blocks and verifies them whole — the tuple, the hash chain, every tensor's shape, dtype and sha256 —
  before it tells vLLM how many tokens it can skip; the worker copies the verified tensors into the
  blocks vLLM allocated.
- **Miss, never misuse.** Another tuple, a torn checkpoint (a manifest naming a missing block), a checksum
  or chain that does not match, an unreadable store: the blocks are computed as if nothing were stored,
  and `lifeline_kv_connector_misses_total{reason}` says why. A verified load cannot fail later: the
  bytes are in memory before vLLM is promised them, so vLLM's own load-failure path is never taken.

Metrics, on vLLM's own `/metrics`: `lifeline_kv_connector_hit_tokens_total` (prompt tokens loaded, not
computed), `_loaded_blocks_total`, `_saved_blocks_total`, `_misses_total{reason}`.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import vllm
from prometheus_client import Counter
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.logger import init_logger

from contract.holder import KVValidity, engine_validity, kv_chain_hashes, kv_root_hash
from contract.identity import directory_weights_digest
from contract.kv_checkpoint import (
    BLOCK_TENSOR,
    KVBlockEntry,
    KVCheckpointError,
    KVCheckpointInvalid,
    KVCheckpointManifest,
    KVCheckpointStore,
    KVValidityMismatch,
    TornCheckpoint,
    block_object_checksum,
    manifest_key,
    open_kv_store,
)
from contract.session import CHECKPOINT_PARAM, KVCheckpointAsk, KVCheckpointWritten

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = init_logger(__name__)

MISS_REASONS = ("validity", "torn", "invalid", "store_unavailable")
_LAYER = re.compile(r"layers\.(\d+)\.")
WRITE_QUEUE = 64  # checkpoints waiting for the writer thread; more are dropped and counted, never waited for
_STATS_LOCK = threading.Lock()


def vllm_kv_order() -> str:
    """How this vLLM lays a block's bytes out: its version and attention backend's paged layout, as copied.

    The bytes are vLLM's CPU kernel's own (`cpu_attn_reshape_and_cache`), not the reference engine's axis
    order: a reference engine with the same weights, dtype and block size computes other bytes for the same
    keys (measured: imported into it, they changed its answer). So the layout names vLLM and its version, the
    tuple differs, and the two engines never share checkpoints — a miss, never a misuse; vLLMs of one version
    share them across regions."""
    return f"vllm-{vllm.__version__}/CPU_ATTN/blocks.kv_head.(k_block|v_block).head_dim"


@dataclass
class BlockLoad:
    block_id: int  # vLLM's block, allocated for the request
    kv: torch.Tensor  # verified: [2, layers, kv heads, block, head dim]


@dataclass
class CheckpointSave:
    request_id: str  # vLLM's: the blocks are freed once it is reported copied
    token_ids: list[int]  # the full blocks' tokens, in order
    block_ids: list[int]
    ask: KVCheckpointAsk  # who asked (the manifest's provenance and session class)


@dataclass
class LifelineConnectorMetadata(KVConnectorMetadata):
    loads: list[BlockLoad] = field(default_factory=list)
    saves: list[CheckpointSave] = field(default_factory=list)


@dataclass
class LifelineKVStats(KVConnectorStats):
    """Counts since the last report: `hit_tokens`, `loaded_blocks`, `saved_blocks`, `miss.<reason>`."""

    def add(self, key: str, count: int = 1) -> None:
        with _STATS_LOCK:  # the writer thread counts too
            self.data[key] = self.data.get(key, 0) + count

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, count in other.data.items():
            self.add(key, count)
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not self.data


class LifelinePromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config: VllmConfig, metric_types: dict, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        # prometheus_client's Counter itself, the class vLLM's Prometheus logger passes as metric_types[Counter]
        # (only its Ray logger passes another): named here, the docs' contract test reads these definitions.
        self.counters = {
            "hit_tokens": Counter("lifeline_kv_connector_hit_tokens",
                                  "Prompt tokens loaded from a Lifeline checkpoint instead of computed", labelnames),
            "loaded_blocks": Counter("lifeline_kv_connector_loaded_blocks",
                                     "KV blocks loaded from a Lifeline checkpoint", labelnames),
            "saved_blocks": Counter("lifeline_kv_connector_saved_blocks",
                                    "KV blocks written to Lifeline's checkpoint store", labelnames),
        }
        self.misses = Counter("lifeline_kv_connector_misses",
                              "Checkpointed prefixes not used, and why (the blocks were computed)",
                              [*labelnames, "reason"])

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        labels = self.per_engine_labelvalues[engine_idx]
        for key, count in transfer_stats_data.items():
            if key.startswith("miss."):
                self.misses.labels(*labels, key.removeprefix("miss.")).inc(count)
            elif key in self.counters:
                self.counters[key].labels(*labels).inc(count)


class LifelineKVConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig | None = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        if "store" not in extra:
            raise ValueError("LifelineKVConnector needs kv_connector_extra_config.store (a KV store URL)")
        self.store = KVCheckpointStore(open_kv_store(extra["store"], s3_endpoint_url=extra.get("s3_endpoint_url")))
        model_dir = Path(vllm_config.model_config.model)
        digest = extra.get("weights_digest") or directory_weights_digest(model_dir)
        self.block_tokens = vllm_config.cache_config.block_size
        dtype = str(vllm_config.model_config.dtype).removeprefix("torch.")
        self.validity: KVValidity = engine_validity(model_dir, digest, block_tokens=self.block_tokens, dtype=dtype,
                                                    kv_order=vllm_kv_order())
        self.root = kv_root_hash(self.validity)
        self.instance_id: str | None = extra.get("instance_id")
        self.stats = LifelineKVStats()
        # scheduler side
        # request id → (its first block not computed locally, the verified blocks from there)
        self._found: dict[str, tuple[int, list[torch.Tensor]]] = {}
        self._loads: list[BlockLoad] = []
        self._saves: list[CheckpointSave] = []
        # worker side
        self._caches: list[torch.Tensor] = []  # per layer, in layer order
        self._copied: set[str] = set()  # requests whose blocks were copied out: vLLM may free them
        self._writes: queue.Queue[tuple[CheckpointSave, list[torch.Tensor]]] = queue.Queue(WRITE_QUEUE)
        if role == KVConnectorRole.WORKER:
            threading.Thread(target=self._write_forever, name="lifeline-kv-writer", daemon=True).start()
        log.info("Lifeline KV connector (%s): store %s, root %s, block %d, %s", role.name,
                 self.store.store.location, self.root[:12], self.block_tokens, dtype)

    # -- scheduler side -------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        """Tokens after the locally computed ones that a verified checkpoint provides (0 on any miss)."""
        prompt = list(request.prompt_token_ids or [])
        usable = (len(prompt) - 1) // self.block_tokens  # the last prompt position is always computed
        first = num_computed_tokens // self.block_tokens
        if usable <= first:
            return 0, False
        found = self._found.get(request.request_id)
        if found is not None and found[0] == first:  # asked again while it waits for blocks: verified already
            return len(found[1]) * self.block_tokens, False
        hashes = kv_chain_hashes(self.root, prompt[:usable * self.block_tokens], self.block_tokens)
        try:
            last = self.store.longest_manifest(self.root, hashes)
            if last is None:
                return 0, False
            manifest = self.store.read_manifest(self.root, last)
            blocks = self._verified(manifest, hashes, first) if manifest is not None else None
        except KVValidityMismatch:
            return self._miss("validity")
        except KVCheckpointInvalid as exc:
            log.warning("Lifeline checkpoint for %s not used: %s", request.request_id, exc)
            return self._miss("torn" if isinstance(exc, TornCheckpoint) else "invalid")
        except KVCheckpointError as exc:
            log.warning("Lifeline checkpoint store did not answer for %s: %s", request.request_id, exc)
            return self._miss("store_unavailable")
        if not blocks:
            return 0, False
        self._found[request.request_id] = (first, blocks)
        return len(blocks) * self.block_tokens, False

    def _verified(self, manifest: KVCheckpointManifest, hashes: list[str], first: int) -> list[torch.Tensor]:
        """The manifest's blocks from `first` on, each checked against the tuple, the chain and its sha256."""
        if [b.hash for b in manifest.blocks] != hashes[:len(manifest.blocks)]:
            raise KVCheckpointInvalid("the manifest's chain is not this prompt's")
        return [load_tensors(data)[BLOCK_TENSOR]
                for data in self.store.read_verified_blocks(manifest, self.validity, start=first)]

    def _miss(self, reason: str) -> tuple[int, bool]:
        self.stats.add(f"miss.{reason}")
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        found = self._found.pop(request.request_id, None)
        if found is None or num_external_tokens == 0:
            return
        start, tensors = found
        block_ids = blocks.get_block_ids()[0]
        count = num_external_tokens // self.block_tokens
        for block_id, kv in zip(block_ids[start:start + count], tensors[:count], strict=True):
            self._loads.append(BlockLoad(block_id, kv))
        self.stats.add("hit_tokens", num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = LifelineConnectorMetadata(loads=self._loads, saves=self._saves)
        self._loads, self._saves = [], []
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """A request that asked for a checkpoint keeps its blocks until the worker has copied them; its answer's
        `kv_transfer_params` say what is being written (`KVCheckpointWritten`, `written: false`)."""
        self._found.pop(request.request_id, None)
        params = (request.kv_transfer_params or {}).get(CHECKPOINT_PARAM)
        full = request.num_computed_tokens // self.block_tokens
        if params is None or full == 0:
            return False, None
        try:
            ask = KVCheckpointAsk.model_validate(params)
        except ValueError as exc:
            log.warning("Lifeline checkpoint of %s not taken: %s", request.request_id, exc)
            return False, None
        tokens = list(request.all_token_ids)[:full * self.block_tokens]
        self._saves.append(CheckpointSave(request.request_id, tokens, list(block_ids[:full]), ask))
        last = kv_chain_hashes(self.root, tokens, self.block_tokens)[-1]
        cached = max(getattr(request, "num_cached_tokens", 0), 0)
        planned = KVCheckpointWritten(root_hash=self.root, last_hash=last, key=manifest_key(self.root, last),
                                      blocks=full, tokens=len(tokens), written=False,
                                      computed_tokens=max(request.num_computed_tokens - cached, 0))
        return True, {CHECKPOINT_PARAM: planned.model_dump()}

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        with _STATS_LOCK:
            if self.stats.is_empty():
                return None
            stats, self.stats = self.stats, LifelineKVStats()
        return stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return LifelineKVStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: VllmConfig, metric_types: dict, labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> KVConnectorPromMetrics | None:
        return LifelinePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # -- worker side ----------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """vLLM's paged cache, per layer: [blocks, kv heads, block, 2 × head dim] (the CPU backend's layout)."""
        layout = self.validity.layout
        expected = (layout.num_kv_heads, self.block_tokens, 2 * layout.head_dim)
        ordered = sorted(kv_caches.items(), key=lambda item: int(_LAYER.search(item[0]).group(1)))  # type: ignore[union-attr]
        for name, cache in ordered:
            if tuple(cache.shape[1:]) != expected:
                raise ValueError(f"LifelineKVConnector: layer {name}'s KV cache is {list(cache.shape)}, not "
                                 f"[blocks, {', '.join(map(str, expected))}] (vLLM's CPU attention layout)")
        if len(ordered) != layout.num_layers:
            raise ValueError(f"LifelineKVConnector: {len(ordered)} KV caches for {layout.num_layers} layers")
        self._caches = [cache for _, cache in ordered]

    def _block_view(self, layer: int, block_id: int) -> torch.Tensor:
        """One block of one layer as [kv heads, 2 × block, head dim]: keys in the first half, values after."""
        layout = self.validity.layout
        return self._caches[layer][block_id].view(layout.num_kv_heads, 2 * self.block_tokens, layout.head_dim)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, LifelineConnectorMetadata)
        size = self.block_tokens
        for load in meta.loads:
            for layer in range(len(self._caches)):
                view = self._block_view(layer, load.block_id)
                view[:, :size].copy_(load.kv[0, layer])
                view[:, size:].copy_(load.kv[1, layer])
        if meta.loads:
            self.stats.add("loaded_blocks", len(meta.loads))

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are copied whole in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # checkpoints are taken from whole finished requests, in wait_for_save

    def wait_for_save(self) -> None:
        """Copy every finished request's blocks out of the paged cache (vLLM may then free them); queue the write."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, LifelineConnectorMetadata)
        size = self.block_tokens
        for save in meta.saves:
            blocks = []
            for block_id in save.block_ids:
                views = [self._block_view(layer, block_id) for layer in range(len(self._caches))]
                blocks.append(torch.stack([torch.stack([v[:, :size] for v in views]),
                                           torch.stack([v[:, size:] for v in views])]).contiguous())
            self._copied.add(save.request_id)
            try:
                self._writes.put_nowait((save, blocks))
            except queue.Full:
                log.warning("Lifeline checkpoint of %s skipped: %d writes already waiting", save.request_id,
                            WRITE_QUEUE)
                self.stats.add("skipped_checkpoints")

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        copied, self._copied = self._copied, set()
        return (copied or None), None

    def _write_forever(self) -> None:
        while True:
            save, blocks = self._writes.get()
            try:
                self._write(save, blocks)
            except KVCheckpointError as exc:
                log.warning("Lifeline checkpoint of %s not written: %s", save.request_id, exc)
                self.stats.add("failed_checkpoints")

    def _write(self, save: CheckpointSave, blocks: list[torch.Tensor]) -> None:
        """Blocks first, then the manifest that names them (a reader never finds a manifest without its blocks)."""
        hashes = kv_chain_hashes(self.root, save.token_ids, self.block_tokens)
        missing = set(self.store.missing_blocks(self.root, hashes))
        entries = []
        for index, (block_hash, kv) in enumerate(zip(hashes, blocks, strict=True)):
            data = save_tensors({BLOCK_TENSOR: kv})
            checksum = block_object_checksum(data, self.validity)
            if block_hash in missing:
                self.store.write_block(self.root, block_hash, data)
            entries.append(KVBlockEntry(hash=block_hash, checksum=checksum,
                                        token_ids=save.token_ids[index * self.block_tokens:
                                                                 (index + 1) * self.block_tokens]))
        self.store.write_manifest(KVCheckpointManifest(
            validity=self.validity, root_hash=self.root, blocks=entries, instance_id=self.instance_id,
            request_id=save.ask.request_id or save.request_id, created_at=time.time(),
            session_class=save.ask.session_class))
        self.stats.add("saved_blocks", len(missing))
