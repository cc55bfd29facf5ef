"""What one running engine process is: its model, scheduler, identity and lifecycle status.

Built once in the lifespan (`load_runtime`), shared by every handler through
`app.state.runtime`. Two generations live here and must not be confused with
a decode stream (`engine.response_shapes.DecodeStream`): the boot generation
(a counter in the state directory) and the lease registry's generation, which
supersedes it once the engine registers.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

import structlog
import torch
from tokenizers import Tokenizer

from common.clock import Clock
from common.logs import get_logger
from contract.identity import EngineIdentity, directory_weights_digest
from engine.boot_generation import next_boot_generation
from engine.faults import FaultInjector
from engine.holder_client import (
    HolderTenancy,
    HolderUnavailable,
    attach,
    check_compatible,
    map_weights,
    region_file_id,
)
from contract.holder import AttachResponse, KVValidity, WeightsDescription, engine_validity
from contract.kv_checkpoint import KVCheckpointStore, open_kv_store
from engine.kv_pool import HolderKVPool
from engine.kv_transfer import KVCheckpointer
from engine.lifecycle import EngineStatus, InvalidTransition, LifecycleEvent, transition
from engine.metrics import EngineMetrics
from engine.model import LlamaModel
from engine.prefix_cache import LocalPrefixCache, PrefixCache
from engine.sampling import SamplingParams
from engine.scheduler import ErrorEvent, Scheduler, Sequence
from engine.settings import EngineSettings, FaultSettings

log = get_logger(__name__)

SELF_TEST_PROMPT = "Healthy engine serves the request."


def _load_chat_template(model_dir: Path) -> str | None:
    path = model_dir / "tokenizer_config.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("chat_template")


@dataclass
class WeightsOrigin:
    """Where this process's weights came from, for /healthz/weights and the restart benchmark."""

    source: str  # "holder" | "disk"
    holder_url: str | None = None
    fallback_reason: str | None = None  # why a holder was asked for and not used
    region_id: int | None = None
    holder_epoch: int | None = None
    takeover: bool = False
    primed: bool = False  # the views a standby mapped, pre-faulted and self-tested before activation
    prime_miss_reason: str | None = None  # why a standby's priming was not used (the region was re-mapped)
    primed_self_test: list[int] | None = None  # the tokens the priming's self-test generated
    attach_s: float = 0.0  # the attach round trip
    map_s: float = 0.0  # building tensor views over the region
    load_s: float = 0.0  # reading and converting shards, and hashing them (disk only)
    tenancy: HolderTenancy | None = None
    kv_pool: HolderKVPool | None = None

    def body(self) -> dict:
        tenancy = self.tenancy
        return {"source": self.source, "holder_url": self.holder_url, "fallback_reason": self.fallback_reason,
                "region_id": self.region_id, "holder_epoch": self.holder_epoch, "takeover": self.takeover,
                "primed": self.primed, "prime_miss_reason": self.prime_miss_reason,
                "holder_connected": bool(tenancy and tenancy.connected and not tenancy.superseded),
                "kv_pool": bool(self.kv_pool and self.kv_pool.enabled),
                "attach_s": round(self.attach_s, 6), "map_s": round(self.map_s, 6), "load_s": round(self.load_s, 6)}


@dataclass
class PrimedWeights:
    """A holder's weights that a standby mapped, pre-faulted and self-tested before it knew what it would serve.

    Built by `engine.standby.prime` off the restart's path; offered once to this
    process (`offer_primed`) and taken by the engine it becomes, which uses it only
    if the holder it attaches to still describes exactly this region (`mismatch`).
    """

    holder_url: str
    model_dir: Path  # resolved
    dtype: str
    holder_epoch: int
    description: WeightsDescription
    file_id: tuple[int, int]  # (st_dev, st_ino) of the region file the views map
    model: LlamaModel
    self_test_tokens: list[int]

    def mismatch(self, settings: EngineSettings, attached: AttachResponse) -> str | None:
        """Why these views cannot serve `settings` under `attached` (a miss: re-map), or None when they can."""
        if settings.holder != self.holder_url:
            return f"primed from holder {self.holder_url}, serving from {settings.holder}"
        if settings.model.resolve() != self.model_dir or settings.dtype != self.dtype:
            return f"primed for {self.model_dir} in {self.dtype}, serving {settings.model} in {settings.dtype}"
        if attached.holder_epoch != self.holder_epoch:
            return f"the holder restarted since priming (epoch {self.holder_epoch} → {attached.holder_epoch})"
        region = attached.weights.region
        if attached.weights != self.description:
            return (f"the holder's weights region changed since priming (region {self.description.region.region_id} "
                    f"→ {region.region_id})")
        if region_file_id(region.path) != self.file_id:
            return f"region file {region.path} was replaced since priming"
        return None


_primed: list[PrimedWeights] = []  # at most one: a standby primes once and becomes at most one engine


def offer_primed(primed: PrimedWeights) -> None:
    """Hand this process's priming to the engine it will become (engine/standby.py)."""
    _primed[:] = [primed]


def _take_primed() -> PrimedWeights | None:
    return _primed.pop() if _primed else None


def _from_holder(settings: EngineSettings, dtype: torch.dtype, generation: int, clock: Clock,
                 metrics: EngineMetrics) -> tuple[LlamaModel, str, WeightsOrigin]:
    assert settings.holder is not None  # noqa: S101 - checked by the caller
    primed = _take_primed()
    started = clock.now()
    attached = attach(settings.holder, settings.instance_id, generation)
    check_compatible(attached.weights, settings.model, dtype)
    attached_at = clock.now()
    miss = primed.mismatch(settings, attached) if primed is not None else None
    if miss is not None:
        primed = None  # dropped: its views (and the pages they pin) go with it
        metrics.prime_misses.inc()
        log.warning("primed weights not used; re-mapping the region", reason=miss)
    model = primed.model if primed is not None else LlamaModel.from_weights(settings.model,
                                                                            map_weights(attached.weights), dtype)
    tenancy = HolderTenancy(settings.holder, settings.instance_id, generation, attached.heartbeat_interval_s)
    tenancy.holder_epoch = attached.holder_epoch
    origin = WeightsOrigin(source="holder", holder_url=settings.holder, region_id=attached.weights.region.region_id,
                           holder_epoch=attached.holder_epoch, takeover=attached.takeover,
                           primed=primed is not None, prime_miss_reason=miss,
                           primed_self_test=primed.self_test_tokens if primed is not None else None,
                           attach_s=attached_at - started, map_s=clock.now() - attached_at, tenancy=tenancy)
    if attached.kv is not None:
        validity = engine_validity(settings.model, attached.weights.weights_digest,
                                   block_tokens=attached.kv.layout.block_tokens, dtype=settings.dtype)
        unfit = HolderKVPool.fits(attached.kv, validity)
        if unfit is None:
            origin.kv_pool = HolderKVPool(settings.holder, settings.instance_id, generation, attached.kv, metrics)
        else:
            log.warning("holder's kv pool not used", reason=unfit)
    return model, attached.weights.weights_digest, origin


def load_weights_for(settings: EngineSettings, dtype: torch.dtype, generation: int, metrics: EngineMetrics,
                     clock: Clock) -> tuple[LlamaModel, str, WeightsOrigin]:
    """Map the holder's weights when one is configured and usable; otherwise load from disk and say why."""
    reason = None
    if settings.holder:
        try:
            model, digest, origin = _from_holder(settings, dtype, generation, clock, metrics)
        except HolderUnavailable as exc:
            reason = str(exc)
            metrics.holder_fallbacks.inc()
            log.warning("holder unavailable; loading weights from disk", holder=settings.holder, reason=reason)
        else:
            assert origin.tenancy is not None  # noqa: S101
            origin.tenancy.start()
            metrics.weights_from_holder.set(1)
            metrics.weights_primed.set(1 if origin.primed else 0)
            metrics.holder_connected.set_function(lambda: 1 if origin.tenancy and origin.tenancy.connected else 0)
            log.info("weights mapped from the holder", holder=settings.holder, region=origin.region_id,
                     holder_epoch=origin.holder_epoch, takeover=origin.takeover, primed=origin.primed,
                     attach_s=round(origin.attach_s, 4), map_s=round(origin.map_s, 4))
            return model, digest, origin
    started = clock.now()
    model = LlamaModel.load(settings.model, dtype)
    digest = directory_weights_digest(settings.model)
    metrics.weights_from_holder.set(0)
    metrics.holder_connected.set(0)
    return model, digest, WeightsOrigin(source="disk", holder_url=settings.holder, fallback_reason=reason,
                                        load_s=clock.now() - started)


def build_kv(settings: EngineSettings, digest: str, origin: WeightsOrigin, metrics: EngineMetrics,
             clock: Clock) -> tuple[PrefixCache | None, KVCheckpointer | None]:
    """The prefix cache (the holder's pool if attached, else in process memory) and the checkpoint store."""
    prefix_cache: PrefixCache | None = origin.kv_pool
    if prefix_cache is None and settings.kv_cache_blocks:
        validity = engine_validity(settings.model, digest, block_tokens=settings.kv_block_tokens, dtype=settings.dtype)
        prefix_cache = LocalPrefixCache(validity, settings.kv_cache_blocks)
    if not settings.kv_checkpoint_store or prefix_cache is None:
        return prefix_cache, None
    store = open_kv_store(settings.kv_checkpoint_store, s3_endpoint_url=settings.kv_checkpoint_s3_endpoint_url)
    checkpointer = KVCheckpointer(KVCheckpointStore(store), prefix_cache.validity, prefix_cache.root_hash,
                                  prefix_cache, metrics, clock, instance_id=settings.instance_id,
                                  every_tokens=settings.kv_checkpoint_every)
    log.info("kv checkpoints on", store=store.location, every_tokens=settings.kv_checkpoint_every,
             block_tokens=prefix_cache.block_tokens, root_hash=prefix_cache.root_hash[:16])
    return prefix_cache, checkpointer


@dataclass
class EngineRuntime:
    settings: EngineSettings
    clock: Clock
    tokenizer: Tokenizer
    model: LlamaModel
    scheduler: Scheduler
    metrics: EngineMetrics
    faults: FaultInjector
    chat_template: str | None
    boot_generation: int
    weights_digest: str
    started_at: float  # Unix seconds
    status: EngineStatus = EngineStatus.STARTING
    # The lease registry's generation supersedes the boot counter once registered.
    lease_generation: int | None = None
    weights_origin: WeightsOrigin = field(default_factory=lambda: WeightsOrigin(source="disk"))
    kv_validity: KVValidity | None = None  # the tuple that roots this engine's KV block chains
    prefix_cache: PrefixCache | None = None  # the holder's pool, the in-process cache, or none
    checkpointer: KVCheckpointer | None = None  # with --kv-checkpoint-store

    @property
    def generation(self) -> int:
        return self.lease_generation if self.lease_generation is not None else self.boot_generation

    @property
    def fences_by_generation(self) -> bool:
        """Whether responses carry `X-Lifeline-Generation`: only when this process holds its own lease.

        An engine started without `--registry` is leased by someone else (the
        regional agent) under a generation it cannot know; stamping its boot
        counter instead made gateways refuse its frames as `stale_generation`
        once that lease was registered a second time. Leaving the header out
        is what stock vLLM does, and the gateway checks only a header present.
        """
        return self.settings.registry is not None

    @property
    def ready(self) -> bool:
        return self.status is EngineStatus.READY

    def apply(self, event: LifecycleEvent) -> bool:
        """Move the lifecycle; an event that does not apply now is logged and ignored."""
        try:
            new = transition(self.status, event)
        except InvalidTransition as exc:
            log.info("lifecycle event ignored", status=self.status, lifecycle_event=event, detail=str(exc))
            return False
        if new is not self.status:
            log.info("engine status changed", old=self.status, new=new, lifecycle_event=event)
        self.status = new
        self.metrics.ready.set(1 if self.ready else 0)
        return True

    def adopt_lease_generation(self, generation: int) -> None:
        self.lease_generation = generation
        structlog.contextvars.bind_contextvars(generation=generation)
        self.apply(LifecycleEvent.LEASE_REGISTERED)

    def identity(self) -> EngineIdentity:
        return EngineIdentity(
            instance_id=self.settings.instance_id, generation=self.generation, boot_generation=self.boot_generation,
            model=self.settings.model_name, weights_digest=self.weights_digest, zone=self.settings.zone,
            region=self.settings.region, started_at=self.started_at,
        )


async def load_runtime(settings: EngineSettings, fault_settings: FaultSettings, clock: Clock) -> EngineRuntime:
    """Load weights, start the decode loop; the runtime is STARTING until `self_test` passes."""
    if settings.torch_threads:
        torch.set_num_threads(settings.torch_threads)
    boot_generation = next_boot_generation(settings.resolved_state_dir())
    structlog.contextvars.bind_contextvars(instance=settings.instance_id, generation=boot_generation)
    log.info("engine starting", model=str(settings.model), dtype=settings.dtype, port=settings.port)
    metrics = EngineMetrics()
    metrics.boot_generation.set(boot_generation)
    dtype = torch.float64 if settings.dtype == "float64" else torch.float32
    model, digest, origin = await asyncio.to_thread(load_weights_for, settings, dtype, boot_generation, metrics, clock)
    faults = FaultInjector(fault_settings, metrics, model)
    prefix_cache, checkpointer = build_kv(settings, digest, origin, metrics, clock)
    scheduler = Scheduler(model, metrics, max_num_seqs=settings.max_num_seqs,
                          max_prefill_tokens=settings.max_prefill_tokens, hooks=faults, clock=clock,
                          prefix_cache=prefix_cache, checkpointer=checkpointer,
                          step_stall_bound_s=settings.step_stall_bound.total_seconds(),
                          max_waiting=settings.max_waiting)
    runtime = EngineRuntime(
        settings=settings, clock=clock, tokenizer=Tokenizer.from_file(str(settings.model / "tokenizer.json")),
        model=model, scheduler=scheduler, metrics=metrics, faults=faults,
        chat_template=_load_chat_template(settings.model), boot_generation=boot_generation,
        weights_digest=digest, started_at=clock.wall(), weights_origin=origin,
        kv_validity=prefix_cache.validity if prefix_cache is not None else None, prefix_cache=prefix_cache,
        checkpointer=checkpointer,
    )
    if checkpointer is not None:
        checkpointer.generation_of = lambda: runtime.generation
    scheduler.start()
    return runtime


# The self-test's size. Its purpose: every weight, the tokenizer, a prefill over more than one position
# (causal mask, RoPE), a decode step that reads back the KV the prefill wrote, the sampler — each once.
# A 2-token prompt and 2 output tokens (the first from the prefill, the second from a decode step) do all
# of that; the whole prompt (6 tokens) and 4 tokens it had repeated the same code. Measured on `small`
# (one process, one thread, mapped weights): a 2-token prefill 0.16 s, a 9-token one 0.28 s, a decode step
# 0.08 s, and the first pass over freshly mapped pages no slower than the next, so the self-test goes from
# ~0.5 s to ~0.24 s — most of a standby restart's `ready` phase (bench/holder.py; docs/holder.md).
SELF_TEST_PROMPT_TOKENS = 2
SELF_TEST_TOKENS = 2


async def self_test_tokens(tokenizer: Tokenizer, scheduler: Scheduler) -> list[int]:
    """The self-test's greedy tokens, generated through `scheduler` (which must be running)."""
    seq = Sequence(
        request_id="self-test",
        prompt_ids=tokenizer.encode(SELF_TEST_PROMPT, add_special_tokens=False).ids[:SELF_TEST_PROMPT_TOKENS],
        max_tokens=SELF_TEST_TOKENS,
        sampling=SamplingParams(temperature=0.0),
        seed=0,
        stop_token_ids=frozenset(),
        logprobs=None,
        loop=asyncio.get_running_loop(),
    )
    scheduler.submit(seq)
    for _ in range(seq.max_tokens):
        event = await asyncio.wait_for(seq.events.get(), timeout=120)
        if isinstance(event, ErrorEvent):
            raise RuntimeError(f"self-test generation failed: {event.message}")
    return seq.output_ids


async def self_test(runtime: EngineRuntime) -> None:
    """Generate greedy tokens end to end, through the prefill and a decode step; readiness waits on this.

    Weights a standby primed were self-tested there, through a scheduler over
    these very views, before activation; the engine it became takes that
    result instead of running the model again on the restart's path.
    """
    primed_tokens = runtime.weights_origin.primed_self_test
    if primed_tokens is not None:
        log.info("self-test passed", tokens=primed_tokens, at_priming=True)
    else:
        log.info("self-test passed", tokens=await self_test_tokens(runtime.tokenizer, runtime.scheduler))
    runtime.apply(LifecycleEvent.SELF_TEST_PASSED)
