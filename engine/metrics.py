"""Prometheus metrics, named as vLLM names them where vLLM has the same metric.

The gateway and dashboards built for vLLM then read the reference engine
without a translation table; what only Lifeline has is prefixed `lifeline_`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.running = Gauge("vllm:num_requests_running", "Sequences being decoded", registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Sequences waiting for a decode slot", registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens", registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefilled prompt tokens", registry=r)
        self.requests = Counter(
            "lifeline_engine_requests", "Finished requests by outcome", ["outcome"], registry=r
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.refused_overloaded = Counter(
            "lifeline_engine_refused_overloaded", "Requests refused with 429 because max_waiting sequences waited",
            registry=r)
        self.faults = Counter("lifeline_engine_faults_injected", "Faults injected", ["fault"], registry=r)
        self.ready = Gauge("lifeline_engine_ready", "1 once weights are loaded and self-test passed", registry=r)
        self.boot_generation = Gauge("lifeline_engine_boot_generation", "Boot generation", registry=r)
        self.weights_from_holder = Gauge(
            "lifeline_engine_weights_from_holder", "1 if the weights are mapped from the memory holder, 0 if loaded from disk",
            registry=r)
        self.holder_connected = Gauge(
            "lifeline_engine_holder_connected", "1 while the memory holder answers this engine's heartbeats", registry=r)
        self.kv_reused_tokens = Counter(
            "lifeline_engine_kv_reused_tokens",
            "Prompt positions restored from the prefix cache (the holder's KV pool or process memory), not prefilled",
            registry=r)
        self.kv_imported_tokens = Counter(
            "lifeline_engine_kv_imported_tokens",
            "Prompt positions restored from blocks imported from the KV checkpoint store for that request",
            registry=r)
        self.kv_imports = Counter(
            "lifeline_engine_kv_imports", "KV checkpoint imports by source (store, http) and outcome",
            ["source", "outcome"], registry=r)
        self.kv_checkpoints = Counter(
            "lifeline_engine_kv_checkpoints", "KV checkpoints by outcome (written, skipped, failed)", ["outcome"],
            registry=r)
        self.kv_decode_thread_seconds = Counter(
            "lifeline_engine_kv_decode_thread_seconds",
            "Decode-thread time spent keeping KV blocks: publish (prefix cache), checkpoint (copying new blocks "
            "for the writer)", ["work"], registry=r)
        self.kv_checkpoint_write_seconds = Counter(
            "lifeline_engine_kv_checkpoint_write_seconds",
            "Writer-thread wall time spent writing checkpoints to the store (waits on the store included)", registry=r)
        self.kv_checkpoint_write_cpu_seconds = Counter(
            "lifeline_engine_kv_checkpoint_write_cpu_seconds",
            "Writer-thread CPU time spent writing checkpoints (hashing, serialising, system calls)", registry=r)
        self.kv_checkpoint_blocks = Counter(
            "lifeline_engine_kv_checkpoint_blocks", "KV blocks written to the checkpoint store", registry=r)
        self.kv_published_blocks = Counter(
            "lifeline_engine_kv_published_blocks", "KV blocks committed to the holder's pool", registry=r)
        self.kv_discarded_blocks = Counter(
            "lifeline_engine_kv_discarded_blocks", "KV blocks found inconsistent with their checksum and not used",
            registry=r)
        self.weights_primed = Gauge(
            "lifeline_engine_weights_primed",
            "1 if the engine serves the views a standby mapped and self-tested before activation", registry=r)
        self.prime_misses = Counter(
            "lifeline_engine_prime_misses",
            "Activations whose standby priming did not match the holder's region (re-mapped instead)", registry=r)
        self.holder_fallbacks = Counter(
            "lifeline_engine_holder_fallbacks", "Starts that wanted the holder and loaded from disk instead", registry=r)
