"""KV export and import, and checkpoints to a shared store: the engine's side of `contract.kv_checkpoint`.

Promise: cheaper semantic recovery. An engine that continues another's stream
(`prompt ‖ committed`, the gateway's migration, unchanged) imports the newest
valid checkpoint of that prefix and prefills only the positions after it; the
tokens are the same as a full prefill's (float64; tests compare them exactly).

Two ways blocks cross engines, one verification:

- HTTP (`engine.kv_router`): `export` answers a *bundle*, one safetensors file
  with a tensor `block.00000`, `block.00001`, … per block and the manifest as
  JSON in its metadata (`lifeline.kv_manifest`); `import` takes the same file.
- A regional store (`--kv-checkpoint-store`): the engine checkpoints every
  running sequence each `--kv-checkpoint-every` committed tokens (full blocks
  only) from a writer thread, and before a prefill looks up the longest
  prefix of the prompt its prefix cache lacks and the store holds.

Whatever the route, `verify_blocks` checks the manifest's tuple against this
engine's (another weight version, tokenizer, dtype, block size → refused as
`KVValidityMismatch`), recomputes the hash chain from the token ids and checks
every tensor's shape, dtype and sha256 before anything is installed; a refusal
installs nothing. The decode thread never waits on a store: it only copies
new full blocks into a bounded queue (a full queue skips that checkpoint and
counts it).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from common.clock import Clock
from common.logs import get_logger
from contract.holder import KVValidity, kv_chain_hashes
from contract.kv_checkpoint import (
    BLOCK_TENSOR,
    KVBlockEntry,
    KVCheckpointInvalid,
    KVCheckpointManifest,
    KVCheckpointStore,
    KVStoreUnavailable,
    KVValidityMismatch,
    block_object_checksum,
    parse_manifest,
    verify_manifest,
)
from engine.errors import KVBlocksAbsent, KVCheckpointRefused, KVValidityRefused
from engine.metrics import EngineMetrics
from engine.model import KVCache
from engine.prefix_cache import KVBlock, PrefixCache, block_of, usable_positions

log = get_logger(__name__)

MANIFEST_METADATA_KEY = "lifeline.kv_manifest"
TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32}
CHECKPOINT_QUEUE = 64  # checkpoints waiting for the writer; more are skipped, never waited for
WRITER_REQUESTS = 1024  # sequences whose chain the writer remembers
FORGET = -1  # a CheckpointJob's first_index that ends a sequence's chain
STORED_CHECKSUMS = 65536  # block checksums known to be in the store (~150 bytes each)


def manifest_for(validity: KVValidity, root_hash: str, blocks: list[KVBlock], checksums: list[str], *,
                 instance_id: str | None, request_id: str | None, created_at: float | None) -> KVCheckpointManifest:
    entries = [KVBlockEntry(hash=b.hash, token_ids=list(b.token_ids), checksum=c)
               for b, c in zip(blocks, checksums, strict=True)]
    return KVCheckpointManifest(validity=validity, root_hash=root_hash, blocks=entries, instance_id=instance_id,
                                request_id=request_id, created_at=created_at)


def encode_block(block: KVBlock) -> bytes:
    return save_tensors({BLOCK_TENSOR: block.kv.contiguous()})


def verify_blocks(manifest: KVCheckpointManifest, tensors: list[torch.Tensor], validity: KVValidity, *,
                  start: int = 0) -> list[KVBlock]:
    """The manifest's blocks from `start` on, once the tuple, the chain and each of those tensors' shape,
    dtype and sha256 check out.

    Raises KVValidityMismatch (another tuple) or KVCheckpointInvalid; builds nothing before all pass.
    Blocks before `start` are the ones this engine already holds: their bytes may differ from the
    manifest's in the last bits (a prefill and a decode step round differently), so they are not compared.
    """
    verify_manifest(manifest, validity)
    layout = validity.layout
    if len(tensors) != len(manifest.blocks) - start:
        raise KVCheckpointInvalid(f"{len(tensors)} tensors for {len(manifest.blocks) - start} blocks")
    parent = manifest.blocks[start - 1].hash if start else manifest.root_hash
    blocks = []
    for index, (entry, tensor) in enumerate(zip(manifest.blocks[start:], tensors, strict=True), start=start):
        if tuple(tensor.shape) != layout.shape or tensor.dtype != TORCH_DTYPES[layout.dtype]:
            raise KVCheckpointInvalid(f"block {index} is {tensor.dtype}{list(tensor.shape)}, "
                                      f"the layout says {layout.dtype}{list(layout.shape)}")
        block = KVBlock(entry.hash, parent, tuple(entry.token_ids), tensor.contiguous())
        if block.checksum() != entry.checksum:
            raise KVCheckpointInvalid(f"block {index}'s sha256 does not match the manifest")
        blocks.append(block)
        parent = entry.hash
    return blocks


def encode_bundle(manifest: KVCheckpointManifest, blocks: list[KVBlock]) -> bytes:
    """One safetensors file: a tensor per block and the manifest in the metadata (HTTP export)."""
    tensors = {f"block.{i:05d}": b.kv.contiguous() for i, b in enumerate(blocks)}
    return save_tensors(tensors, metadata={MANIFEST_METADATA_KEY: manifest.model_dump_json()})


def decode_bundle(data: bytes, validity: KVValidity) -> list[KVBlock]:
    """Verified blocks of an HTTP import; KVCheckpointInvalid / KVValidityMismatch otherwise."""
    try:
        tensors = load_tensors(data)
        header_len = int.from_bytes(data[:8], "little")
        metadata = json.loads(data[8:8 + header_len]).get("__metadata__") or {}
    except (SafetensorError, ValueError, OSError) as exc:
        raise KVCheckpointInvalid(f"not a safetensors file: {exc}") from None
    if MANIFEST_METADATA_KEY not in metadata:
        raise KVCheckpointInvalid(f"the safetensors metadata holds no {MANIFEST_METADATA_KEY!r}")
    manifest = parse_manifest(metadata[MANIFEST_METADATA_KEY].encode())
    names = [f"block.{i:05d}" for i in range(len(manifest.blocks))]
    if sorted(tensors) != names:
        raise KVCheckpointInvalid(f"tensors {sorted(tensors)[:3]}… do not match the manifest's {len(names)} blocks")
    return verify_blocks(manifest, [tensors[name] for name in names], validity)


@dataclass(frozen=True)
class Exported:
    data: bytes
    blocks: int
    tokens: int
    root_hash: str


def export_bundle(prefix_cache: PrefixCache | None, token_ids: list[int], *, instance_id: str,
                  clock: Clock) -> Exported:
    """The prefix cache's longest chain for `token_ids` as a bundle; KVBlocksAbsent if it holds none."""
    if prefix_cache is None:
        raise KVBlocksAbsent("this engine keeps no prefix cache (--kv-cache-blocks 0 and no holder)")
    blocks = prefix_cache.blocks(token_ids)
    if not blocks:
        raise KVBlocksAbsent(f"no full block of this prefix is cached ({prefix_cache.block_tokens} tokens per block)")
    manifest = manifest_for(prefix_cache.validity, prefix_cache.root_hash, blocks, [b.checksum() for b in blocks],
                            instance_id=instance_id, request_id=None, created_at=clock.wall())
    return Exported(encode_bundle(manifest, blocks), len(blocks), len(blocks) * prefix_cache.block_tokens,
                    prefix_cache.root_hash)


def import_bundle(prefix_cache: PrefixCache | None, data: bytes, metrics: EngineMetrics) -> dict:
    """Verify a bundle completely, then install it; a refusal is typed and installs nothing."""
    if prefix_cache is None:
        raise KVBlocksAbsent("this engine keeps no prefix cache to import into (--kv-cache-blocks 0 and no holder)")
    try:
        blocks = decode_bundle(data, prefix_cache.validity)
    except KVValidityMismatch as exc:
        metrics.kv_imports.labels(source="http", outcome="refused_validity").inc()
        raise KVValidityRefused(f"{exc}: a miss for this engine, not imported") from None
    except KVCheckpointInvalid as exc:
        metrics.kv_imports.labels(source="http", outcome="refused_invalid").inc()
        raise KVCheckpointRefused(f"{exc}; nothing imported") from None
    token_ids = [t for b in blocks for t in b.token_ids]
    held = prefix_cache.install(token_ids, blocks)
    metrics.kv_imports.labels(source="http", outcome="imported").inc()
    log.info("kv bundle imported", blocks=len(blocks), held=held, tokens=len(token_ids))
    return {"blocks": len(blocks), "held": held, "tokens": len(token_ids), "root_hash": prefix_cache.root_hash,
            "last_hash": blocks[-1].hash}


@dataclass
class Prefetched:
    """What a store lookup did for one prompt, in blocks from the root."""

    cached_blocks: int = 0  # the prefix cache held these before the lookup
    upto_blocks: int = 0  # the cache holds these after it (imported = upto - cached)
    refused: str | None = None  # why a checkpoint found was not used


@dataclass
class CheckpointJob:
    request_id: str
    first_index: int  # the chain position of blocks[0]
    blocks: list[KVBlock] = field(default_factory=list)


class KVCheckpointer:
    """Checkpoints to, and imports from, one regional store on behalf of this engine."""

    def __init__(self, store: KVCheckpointStore, validity: KVValidity, root_hash: str, prefix_cache: PrefixCache,
                 metrics: EngineMetrics, clock: Clock, *, instance_id: str, every_tokens: int) -> None:
        self.store = store
        self.validity = validity
        self.root_hash = root_hash
        self.prefix_cache = prefix_cache
        self.metrics = metrics
        self.clock = clock
        self.instance_id = instance_id
        self.every_tokens = every_tokens
        self.generation_of: Callable[[], int | None] = lambda: None  # set by the runtime once it exists
        self._jobs: queue.Queue[CheckpointJob | None] = queue.Queue(maxsize=CHECKPOINT_QUEUE)
        # request id → (entries written, blocks not yet written): owned by the writer thread
        self._chains: OrderedDict[str, tuple[list[KVBlockEntry], list[KVBlock]]] = OrderedDict()
        # block hash → checksum of the bytes the store holds for it (written or imported by this process)
        self._stored: OrderedDict[str, str] = OrderedDict()
        self._stored_lock = threading.Lock()
        self._writer = threading.Thread(target=self._write_loop, name="kv-checkpoint-writer", daemon=True)
        self._writer.start()

    @property
    def block_tokens(self) -> int:
        return self.validity.layout.block_tokens

    # -- the decode thread: offer ---------------------------------------------------------
    def due(self, generated: int) -> bool:
        return generated > 0 and generated % self.every_tokens == 0

    def offer(self, request_id: str, cache_length: int, token_ids: list[int], cache: KVCache,
              done_blocks: int) -> int:
        """Queue the full blocks after `done_blocks` for the writer; the new count, or `done_blocks` if skipped."""
        size = self.block_tokens
        full = cache_length // size
        if full <= done_blocks:
            return done_blocks
        blocks = []
        hashes = kv_chain_hashes(self.root_hash, token_ids[:full * size], size)
        for index in range(done_blocks, full):
            parent = hashes[index - 1] if index else self.root_hash
            blocks.append(KVBlock(hashes[index], parent, tuple(token_ids[index * size:(index + 1) * size]),
                                  block_of(cache, index, size)))
        try:
            self._jobs.put_nowait(CheckpointJob(request_id, done_blocks, blocks))
        except queue.Full:
            self.metrics.kv_checkpoints.labels(outcome="skipped").inc()
            return done_blocks
        return full

    def forget(self, request_id: str) -> None:
        """The sequence ended: after its queued checkpoints, the writer drops its chain (a full queue leaves
        that to the writer's bound on remembered chains)."""
        try:
            self._jobs.put_nowait(CheckpointJob(request_id, FORGET))
        except queue.Full:
            pass

    # -- the writer thread -----------------------------------------------------------------
    def _write_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            started, cpu_started = self.clock.now(), time.thread_time()
            try:
                if job.first_index == FORGET:
                    self._chains.pop(job.request_id, None)
                else:
                    self._write(job)
                    self.metrics.kv_checkpoint_write_seconds.inc(self.clock.now() - started)
                    self.metrics.kv_checkpoint_write_cpu_seconds.inc(time.thread_time() - cpu_started)
            except Exception as exc:  # a bug must not stop every later checkpoint
                self.metrics.kv_checkpoints.labels(outcome="failed").inc()
                log.exception("kv checkpoint failed", request_id=job.request_id, error=repr(exc))
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def _write(self, job: CheckpointJob) -> None:
        entries, pending = self._chains.pop(job.request_id, ([], []))
        last = (pending or entries or [None])[-1]
        if len(entries) + len(pending) != job.first_index or (last is not None and last.hash != job.blocks[0].parent_hash):
            entries, pending = [], []  # the writer forgot this chain: start it from the root next time
            if job.first_index:
                log.info("kv checkpoint chain unknown to the writer; skipped", request_id=job.request_id)
                self.metrics.kv_checkpoints.labels(outcome="skipped").inc()
                return
        pending = pending + job.blocks
        self._chains[job.request_id] = (entries, pending)
        self._chains.move_to_end(job.request_id)
        while len(self._chains) > WRITER_REQUESTS:
            self._chains.popitem(last=False)
        try:
            with self._stored_lock:
                unknown = [b.hash for b in pending if b.hash not in self._stored]
            missing = set(self.store.missing_blocks(self.root_hash, unknown)) if unknown else set()
            written = []
            for block in pending:
                checksum = self._stored_checksum(block, missing)
                written.append(KVBlockEntry(hash=block.hash, token_ids=list(block.token_ids), checksum=checksum))
            entries = entries + written
            manifest = KVCheckpointManifest(validity=self.validity, root_hash=self.root_hash, blocks=entries,
                                            instance_id=self.instance_id, generation=self.generation_of(),
                                            request_id=job.request_id, created_at=self.clock.wall())
            self.store.write_manifest(manifest)
        except KVStoreUnavailable as exc:
            self.metrics.kv_checkpoints.labels(outcome="failed").inc()
            log.warning("kv checkpoint not written; kept for the next one", request_id=job.request_id, error=str(exc))
            return
        if job.request_id in self._chains:
            self._chains[job.request_id] = (entries, [])
        self.metrics.kv_checkpoints.labels(outcome="written").inc()
        log.info("kv checkpoint written", request_id=job.request_id, blocks=len(entries),
                 tokens=len(entries) * self.block_tokens, store=self.store.store.location)

    def _stored_checksum(self, block: KVBlock, missing: set[str]) -> str:
        """The checksum of the bytes the store holds under this block's hash, writing ours if it holds none.

        Another engine may have stored the same block computed its own way (a prefill where we decoded):
        equally valid, but other bytes in the last bits, so the manifest must name the stored bytes' sha256.
        """
        with self._stored_lock:
            known = self._stored.get(block.hash)
        if known is not None:
            return known
        checksum = None
        if block.hash not in missing:
            data = self.store.read_block(self.root_hash, block.hash)
            if data is not None:
                try:
                    checksum = block_object_checksum(data, self.validity)
                except KVCheckpointInvalid:
                    log.warning("kv block in the store is not valid; replacing it", block=block.hash[:16])
        if checksum is None:
            self.store.write_block(self.root_hash, block.hash, encode_block(block))
            self.metrics.kv_checkpoint_blocks.inc()
            checksum = block.checksum()
        self.remember_stored(block.hash, checksum)
        return checksum

    def write_chain(self, blocks: list[KVBlock], request_id: str | None,
                    session_class: str | None = None) -> KVCheckpointManifest:
        """Write one chain of blocks from the root (each block the store lacks, then the manifest), now.

        For a caller that must know the checkpoint is stored before it answers (a session's key point,
        `engine.kv_router`); runs in the caller's thread. Raises KVStoreUnavailable.
        """
        with self._stored_lock:
            unknown = [b.hash for b in blocks if b.hash not in self._stored]
        missing = set(self.store.missing_blocks(self.root_hash, unknown)) if unknown else set()
        entries = [KVBlockEntry(hash=b.hash, token_ids=list(b.token_ids), checksum=self._stored_checksum(b, missing))
                   for b in blocks]
        manifest = KVCheckpointManifest(validity=self.validity, root_hash=self.root_hash, blocks=entries,
                                        instance_id=self.instance_id, generation=self.generation_of(),
                                        request_id=request_id, created_at=self.clock.wall(),
                                        session_class=session_class)  # replication's scope
        self.store.write_manifest(manifest)
        self.metrics.kv_checkpoints.labels(outcome="written").inc()
        log.info("kv checkpoint written", request_id=request_id, blocks=len(entries),
                 tokens=len(entries) * self.block_tokens, store=self.store.store.location)
        return manifest

    def remember_stored(self, block_hash: str, checksum: str) -> None:
        with self._stored_lock:
            self._stored[block_hash] = checksum
            self._stored.move_to_end(block_hash)
            while len(self._stored) > STORED_CHECKSUMS:
                self._stored.popitem(last=False)

    def flush(self) -> None:
        """Wait until the writer has finished every queued job (tests)."""
        self._jobs.join()

    def close(self) -> None:
        self._jobs.put(None)
        self._writer.join(timeout=30)

    # -- before a prefill: import --------------------------------------------------------------
    def prefetch(self, prompt_ids: list[int], request_id: str) -> Prefetched:
        """Import the longest checkpointed prefix of this prompt that the prefix cache lacks.

        Runs off the decode thread (the serving layer awaits it before submitting). A store that
        does not answer, or a checkpoint that fails verification, is a miss: the prompt is prefilled.
        So is a bug in this path (logged with its traceback): an import is an optimisation, never a
        reason to fail the request.
        """
        try:
            return self._prefetch(prompt_ids, request_id)
        except Exception as exc:
            log.exception("kv checkpoint lookup failed; prefilling", request_id=request_id, error=repr(exc))
            self.metrics.kv_imports.labels(source="store", outcome="failed").inc()
            return Prefetched()

    def _prefetch(self, prompt_ids: list[int], request_id: str) -> Prefetched:
        size = self.block_tokens
        hashes = kv_chain_hashes(self.root_hash, prompt_ids[:usable_positions(len(prompt_ids), size)], size)
        if not hashes:
            return Prefetched()
        cached = self.prefix_cache.cached_blocks(prompt_ids[:len(hashes) * size])
        result = Prefetched(cached_blocks=cached, upto_blocks=cached)
        if cached == len(hashes):
            return result
        try:
            found = self.store.longest_manifest(self.root_hash, hashes[cached:])
            if found is None:
                return result
            manifest = self.store.read_manifest(self.root_hash, found)
            if manifest is None:
                return result
            blocks = self._fetch_verified(manifest, cached)
        except KVValidityMismatch as exc:
            return self._refused(result, request_id, "validity", exc)
        except KVCheckpointInvalid as exc:
            return self._refused(result, request_id, "invalid", exc)
        except KVStoreUnavailable as exc:
            log.warning("kv checkpoint store unavailable; prefilling", request_id=request_id, error=str(exc))
            self.metrics.kv_imports.labels(source="store", outcome="unavailable").inc()
            return result
        held = self.prefix_cache.install(manifest.token_ids, blocks)
        for entry in manifest.blocks[cached:]:
            self.remember_stored(entry.hash, entry.checksum)
        result.upto_blocks = cached + held
        self.metrics.kv_imports.labels(source="store", outcome="imported").inc()
        log.info("kv checkpoint imported", request_id=request_id, blocks=len(blocks),
                 imported_tokens=held * size, from_instance=manifest.instance_id,
                 from_request=manifest.request_id)
        return result

    def _fetch_verified(self, manifest: KVCheckpointManifest, cached: int) -> list[KVBlock]:
        """The manifest's blocks after the first `cached` (the prefix cache holds those), from the store."""
        tensors = [load_tensors(data)[BLOCK_TENSOR]
                   for data in self.store.read_verified_blocks(manifest, self.validity, start=cached)]
        return verify_blocks(manifest, tensors, self.validity, start=cached)

    def _refused(self, result: Prefetched, request_id: str, reason: str, exc: Exception) -> Prefetched:
        self.metrics.kv_imports.labels(source="store", outcome=f"refused_{reason}").inc()
        log.warning("kv checkpoint refused; prefilling instead", request_id=request_id, reason=reason, error=str(exc))
        result.refused = str(exc)
        return result
