"""What KV replication costs: copy throughput and latency per checkpoint, and the lag a policy achieves.

Issue 12's control-plane half copies checkpoints from the primary region's store to
the standby's, verified on both sides. This measures, on the same synthetic
checkpoints (the `small` preset's KV geometry: 10 layers, 2 KV heads, head dim 64,
float64, 16-token blocks of 320 KiB; `--blocks` blocks per checkpoint), per store
pair (directory → directory, Redis → Redis):

    raw copy       the baseline: every object of the checkpoint (its blocks, then its
                   manifest) read from the source and written to the destination with
                   the store's own get/put, nothing checked
    verified copy  `flows.copy_verified`, what a worker does to the stores: the manifest
                   parsed, each block's sha256 checked at the source and read back at
                   the destination, then the whole checkpoint read back again
    copy task      `tasks.copy`: the verified copy plus the worker's bookkeeping in the
                   control-plane database (SQLite here), without the broker

Each method copies into a fresh destination (no block is already there), the
methods interleaved over `--runs` runs; throughput is the median run, latency the
per-checkpoint median and p95 over all runs. Ratios are against the raw copy of
the same run.

Then the lag: the real Celery tasks, eager (no broker), swept every
`--sweep-every` seconds by this script standing in for beat, while a writer
puts a new checkpoint at each policy's source every `--write-every` seconds,
for `--duration` seconds, Redis → Redis. Lag is a checkpoint's `created_at`
at the source to its verified presence at the destination (seen after each
sweep), against the policy's interval: the sweep for `critical`,
`every_seconds` for `interactive`.

    .venv/bin/python -m bench.replication [--checkpoints 16] [--blocks 8] [--runs 3]
        [--duration 8] [--sweep-every 1] [--write docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import redis
from safetensors.numpy import save

from bench.docs import replace_section
from common.clock import SystemClock
from contract.holder import KVLayout, KVValidity, kv_block_checksum, kv_block_hash, kv_root_hash
from contract.kv_checkpoint import (
    BLOCK_TENSOR,
    KVBlockEntry,
    KVCheckpointManifest,
    KVCheckpointStore,
    block_key,
    manifest_key,
    open_kv_store,
)

HEADING = "## KV replication cost (bench/replication.py)"
REDIS = "redis://127.0.0.1:6379/0"
LAYOUT = KVLayout(block_tokens=16, num_layers=10, num_heads=14, num_kv_heads=2, head_dim=64, dtype="float64",
                  rope_theta=10000.0)
VALIDITY = KVValidity(weights_digest="a" * 64, tokenizer_digest="b" * 64, layout=LAYOUT)
ROOT = kv_root_hash(VALIDITY)


def write_checkpoint(store: KVCheckpointStore, first_token: int, blocks: int, *, created_at: float,
                     rng: np.random.Generator) -> str:
    """Blocks, then the manifest, as an engine writes them; the manifest key. Token ids never repeat."""
    parent, entries = ROOT, []
    for index in range(blocks):
        ids = list(range(first_token + index * LAYOUT.block_tokens, first_token + (index + 1) * LAYOUT.block_tokens))
        parent = kv_block_hash(parent, ids)
        tensor = rng.standard_normal(LAYOUT.shape).astype(LAYOUT.dtype)
        store.write_block(ROOT, parent, save({BLOCK_TENSOR: tensor}))
        entries.append(KVBlockEntry(hash=parent, token_ids=ids, checksum=kv_block_checksum(memoryview(tensor).cast("B"))))
    manifest = KVCheckpointManifest(validity=VALIDITY, root_hash=ROOT, blocks=entries, instance_id="bench",
                                    generation=1, created_at=created_at)
    store.write_manifest(manifest)
    return manifest_key(ROOT, manifest.last_hash)


class Stores:
    """Fresh store URLs per region and per copy, removed at the end."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.prefixes: list[str] = []

    def url(self, backend: str, name: str) -> str:
        if backend == "dir":
            return f"file://{self.work / name}"
        self.prefixes.append(f"bench:replication:{uuid.uuid4().hex}:{name}:")
        return f"{REDIS}?key_prefix={self.prefixes[-1]}&socket_timeout=10"

    def cleanup(self) -> None:
        client = redis.Redis.from_url(REDIS)
        for prefix in self.prefixes:
            for key in client.scan_iter(match=prefix + "*", count=1000):
                client.delete(key)


def database(work: Path) -> tuple[Any, Any]:
    """A control-plane SQLite database at head; (settings, session factory)."""
    from controlplane.config import ControlPlaneSettings
    from controlplane.db import build_engine, build_session_factory
    from controlplane.schema import upgrade

    url = f"sqlite:///{work / 'controlplane.sqlite3'}"
    upgrade(url)
    settings = ControlPlaneSettings(database_url=url, data_dir=work / "data")
    return settings, build_session_factory(build_engine(url))


def put_policy(factory: Any, session_class: str, source: str, destination: str, **spec: Any) -> int:
    from controlplane.db import session_scope
    from controlplane.replication import service
    from controlplane.replication.schemas import ReplicationPolicySpec

    body = ReplicationPolicySpec(model="bench", session_class=session_class, source_store=source,
                                 destination_store=destination, retention_seconds=3600, reason="bench", **spec)
    with session_scope(factory) as session:
        return service.put_policy(session, spec=body, actor="bench", clock=SystemClock()).id


# -- copy throughput and latency -------------------------------------------------------------------


def raw_copy(source: KVCheckpointStore, target: KVCheckpointStore, objects: list[str]) -> None:
    for key in objects:
        data = source.store.get(key)
        if data is None:
            raise SystemExit(f"{key} vanished from the source")
        target.store.put(key, data)


def measure_copies(backend: str, stores: Stores, factory: Any, args: argparse.Namespace) -> dict[str, Any]:
    from controlplane.replication import flows, tasks

    rng = np.random.default_rng(7)
    source_url = stores.url(backend, "primary")
    source = flows.open_checkpoints(source_url, s3_endpoint_url=None)
    now = time.time()
    keys = [write_checkpoint(source, i * 10_000, args.blocks, created_at=now, rng=rng) for i in range(args.checkpoints)]
    objects = {}
    for key in keys:
        manifest = source.manifest_at(key)
        objects[key] = [*(block_key(ROOT, b.hash) for b in manifest.blocks), key]
    checkpoint_bytes = sum(len(source.store.get(o) or b"") for o in objects[keys[0]])

    methods: dict[str, Callable[[KVCheckpointStore, str, str], None]] = {}
    methods["raw copy"] = lambda target, _url, key: raw_copy(source, target, objects[key])
    methods["verified copy"] = lambda target, _url, key: _verified(flows, source, target, key)
    policy_ids: dict[str, int] = {}

    def task_copy(target: KVCheckpointStore, url: str, key: str) -> None:
        if url not in policy_ids:
            policy_ids[url] = put_policy(factory, f"copy-{len(policy_ids)}", source_url, url, mode="critical",
                                         rpo_context_seconds=60)
        outcome = tasks.copy(factory, policy_ids[url], key, clock=SystemClock(), s3_endpoint_url=None)
        if outcome != "replicated":
            raise SystemExit(f"copy task: {outcome}")

    methods["copy task"] = task_copy
    rates: dict[str, list[float]] = {m: [] for m in methods}
    latencies: dict[str, list[float]] = {m: [] for m in methods}
    for run in range(args.runs):
        for name, copy in methods.items():
            url = stores.url(backend, f"standby-{run}-{name.replace(' ', '-')}")
            target = flows.open_checkpoints(url, s3_endpoint_url=None)
            started = time.perf_counter()
            for key in keys:
                one = time.perf_counter()
                copy(target, url, key)
                latencies[name].append(time.perf_counter() - one)
            rates[name].append(len(keys) / (time.perf_counter() - started))
            if sorted(target.manifests()) != sorted(keys):
                raise SystemExit(f"{name}: the destination does not hold every checkpoint")
    return {"rates": rates, "latencies": latencies, "checkpoint_bytes": checkpoint_bytes}


def _verified(flows: Any, source: KVCheckpointStore, target: KVCheckpointStore, key: str) -> None:
    outcome = flows.copy_verified(source, target, key)
    if outcome.already_present:
        raise SystemExit("verified copy: the destination already held the checkpoint")


# -- lag against the policy's interval -------------------------------------------------------------


def measure_lag(stores: Stores, settings: Any, factory: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    from controlplane.celery_app import create_celery
    from controlplane.replication.config import ReplicationSettings
    from controlplane.replication.tasks import SWEEP

    policies = [
        {"session_class": "critical", "mode": "critical", "interval": args.sweep_every, "rpo": 5},
        {"session_class": "interactive", "mode": "interactive", "interval": 3 * args.sweep_every, "rpo": 10,
         "every_seconds": max(1, round(3 * args.sweep_every))},
    ]
    for policy in policies:
        policy["source"] = KVCheckpointStore(open_kv_store(source := stores.url("redis", f"lag-{policy['mode']}-a")))
        policy["target"] = KVCheckpointStore(open_kv_store(target := stores.url("redis", f"lag-{policy['mode']}-b")))
        extra = {"every_seconds": policy["every_seconds"]} if "every_seconds" in policy else {}
        put_policy(factory, policy["session_class"], source, target, mode=policy["mode"],
                   rpo_context_seconds=policy["rpo"], **extra)
        policy["created"], policy["lags"] = {}, []
    app = create_celery(settings, clock=SystemClock(), replication=ReplicationSettings(
        sweep_every=timedelta(seconds=args.sweep_every), replan_after=timedelta(minutes=2)))
    stop = threading.Event()

    def writer() -> None:
        rng, index = np.random.default_rng(11), 0
        while not stop.is_set():
            for policy in policies:
                key = write_checkpoint(policy["source"], 1_000_000 + index * 10_000, args.blocks,
                                       created_at=time.time(), rng=rng)
                policy["created"][key] = time.time()
            index += 1
            stop.wait(args.write_every)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    ends = time.monotonic() + args.duration
    next_sweep = time.monotonic()
    while time.monotonic() < ends:
        stop.wait(max(0.0, next_sweep - time.monotonic()))
        next_sweep += args.sweep_every
        app.tasks[SWEEP].apply()  # eager: the due policies' replicate and copy tasks run here, in order
        seen = time.time()
        for policy in policies:
            for key in policy["target"].manifests():
                if key in policy["created"]:
                    policy["lags"].append(seen - policy["created"].pop(key))
    stop.set()
    thread.join()
    return policies


# -- report ----------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def render(copies: dict[str, dict[str, Any]], lag: list[dict[str, Any]], args: argparse.Namespace,
           elapsed: float) -> str:
    size = next(iter(copies.values()))["checkpoint_bytes"]
    lines = [
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs shared with other sessions' work; Redis on "
        f"loopback; directories on the local disk, each object written atomically with fsync (the store's own put, "
        f"in every method). {args.checkpoints} checkpoints of {args.blocks} blocks "
        f"({size / 2**20:.2f} MiB each, `small` preset geometry, float64), {args.runs} runs interleaved: "
        f"throughput is the median run [min–max], latency per checkpoint the median and p95 over all runs. "
        f"One command, {elapsed:.0f} s in all.",
        "",
        "| stores | method | checkpoints/s | MiB/s | latency p50 | latency p95 | throughput vs raw copy | "
        "latency vs raw copy |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for pair, result in copies.items():
        base_rate = statistics.median(result["rates"]["raw copy"])
        base_latency = statistics.median(result["latencies"]["raw copy"])
        for name, rates in result["rates"].items():
            rate, latency = statistics.median(rates), result["latencies"][name]
            lines.append(
                f"| {pair} | {name} | {rate:.1f} [{min(rates):.1f}–{max(rates):.1f}] | {rate * size / 2**20:.0f} | "
                f"{statistics.median(latency) * 1000:.1f} ms | {pct(latency, 0.95) * 1000:.1f} ms | "
                f"{rate / base_rate:.2f}x | {statistics.median(latency) / base_latency:.2f}x |")
    lines += [
        "",
        f"Lag: Celery's own tasks run eagerly (no broker), a sweep every {args.sweep_every:g} s, a new checkpoint "
        f"at each source every {args.write_every:g} s for {args.duration:g} s, Redis → Redis. Lag: a checkpoint's "
        "creation at the source to its presence at the destination, seen after each sweep.",
        "",
        "| policy | interval | replicated | lag p50 | lag p95 | lag max | max / interval | RPO_context | within |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for policy in lag:
        lags = policy["lags"]
        if not lags:
            lines.append(f"| {policy['mode']} | {policy['interval']:g} s | 0 | – | – | – | – | {policy['rpo']} s | – |")
            continue
        worst = max(lags)
        lines.append(
            f"| {policy['mode']} | {policy['interval']:g} s | {len(lags)} | {statistics.median(lags):.2f} s | "
            f"{pct(lags, 0.95):.2f} s | {worst:.2f} s | {worst / policy['interval']:.2f} | {policy['rpo']} s | "
            f"{'yes' if worst <= policy['rpo'] else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=8, help="blocks per checkpoint (16 tokens each)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of the lag phase")
    parser.add_argument("--sweep-every", type=float, default=1.0)
    parser.add_argument("--write-every", type=float, default=0.4)
    parser.add_argument("--write", type=Path, help="write the results section into this markdown file")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lifeline-bench-replication-") as tmp:
        work = Path(tmp)
        stores = Stores(work)
        try:
            settings, factory = database(work)
            copies = {"dir → dir": measure_copies("dir", stores, factory, args),
                      "Redis → Redis": measure_copies("redis", stores, factory, args)}
            lag = measure_lag(stores, settings, factory, args)
        finally:
            stores.cleanup()
    section = render(copies, lag, args, time.perf_counter() - started)
    print(HEADING + "\n\n" + section)
    if args.write:
        replace_section(args.write, HEADING, section)


if __name__ == "__main__":
    main()
