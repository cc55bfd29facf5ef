"""Shard checksums: the catalog's hasher against `sha256sum`, same files, same run.

Generates a multi-shard artifact (2 GiB by default) in a temporary
directory, warms the page cache, then hashes it four ways, each repeated
and the best run kept:

- `sha256sum` over all shards in one process (single-threaded)
- `sha256sum`, one process per shard, N at a time (`xargs -P N`)
- the catalog hasher with one worker (`hash_shards(workers=1)`)
- the catalog hasher with N worker threads

Digests are checked against sha256sum's before any number is printed.
Targets: catalog single-threaded >= 0.95x sha256sum; catalog parallel faster
than sha256sum. The artifact is deleted afterwards.

    .venv/bin/python -m bench.checksum [--size-gib 2] [--shards 8] [--repeat 3] [--record docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path



from bench.docs import replace_section
from weight_catalog.hashing import DEFAULT_BLOCK_BYTES, hash_shards
from weight_catalog.store import FilesystemStore

HEADING = "## Checksums (bench/checksum.py)"


def make_artifact(root: Path, *, size_bytes: int, shards: int) -> list[Path]:
    block = os.urandom(DEFAULT_BLOCK_BYTES)
    per_shard = size_bytes // shards
    paths = []
    for index in range(shards):
        path = root / f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        with open(path, "wb") as f:
            written = 0
            while written < per_shard:
                chunk = block[: min(len(block), per_shard - written)]
                # vary each block so no two blocks of the artifact are equal
                f.write(index.to_bytes(4, "little") + written.to_bytes(8, "little") + chunk[12:])
                written += len(chunk)
        paths.append(path)
    return paths


def sha256sum(paths: list[Path], parallel: int) -> dict[str, str]:
    if parallel <= 1:
        out = subprocess.run(["sha256sum", *map(str, paths)], check=True, capture_output=True, text=True).stdout
    else:
        out = subprocess.run(
            ["xargs", "-0", "-n", "1", "-P", str(parallel), "sha256sum"],
            input="\0".join(map(str, paths)), check=True, capture_output=True, text=True,
        ).stdout
    digests = {}
    for line in out.splitlines():
        digest, name = line.split(maxsplit=1)
        digests[Path(name.lstrip("*")).name] = digest
    return digests


def catalog(root: Path, workers: int) -> dict[str, str]:
    store = FilesystemStore(root)
    return {d.path: d.sha256 for d in hash_shards(store, sorted(store.list_files()), workers=workers)}


def best_of(repeat: int, run: Callable[[], dict[str, str]]) -> tuple[float, dict[str, str]]:
    best = float("inf")
    result: dict[str, str] = {}
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=2.0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--record", type=Path, help="write the results section into this markdown file")
    args = parser.parse_args()
    if shutil.which("sha256sum") is None:
        raise SystemExit("sha256sum not found")

    size = int(args.size_gib * 1024**3)
    with tempfile.TemporaryDirectory(prefix="lifeline-bench-") as tmp:
        root = Path(tmp)
        paths = make_artifact(root, size_bytes=size, shards=args.shards)
        total = sum(p.stat().st_size for p in paths)
        sha256sum(paths, 1)  # warm the page cache for every contender alike

        runs = [
            ("sha256sum, 1 process", lambda: sha256sum(paths, 1)),
            (f"sha256sum, {args.workers} processes (xargs -P)", lambda: sha256sum(paths, args.workers)),
            ("catalog, 1 thread", lambda: catalog(root, 1)),
            (f"catalog, {args.workers} threads", lambda: catalog(root, args.workers)),
        ]
        results = []
        reference: dict[str, str] | None = None
        for name, run in runs:
            seconds, digests = best_of(args.repeat, run)
            reference = reference or digests
            if digests != reference:
                raise SystemExit(f"{name}: digests differ from sha256sum's")
            results.append((name, seconds))

    base = results[0][1]
    cpu = platform.processor() or platform.machine()
    lines = [
        f"{total / 1024**3:.2f} GiB in {args.shards} shards, page cache warm, best of {args.repeat}; "
        f"{os.cpu_count()} CPUs ({cpu}), shared with other work; block {DEFAULT_BLOCK_BYTES // 1024**2} MiB.",
        "",
        "| method | seconds | MiB/s | vs sha256sum (1 process) |",
        "|---|---:|---:|---:|",
    ]
    for name, seconds in results:
        lines.append(f"| {name} | {seconds:.2f} | {total / 1024**2 / seconds:.0f} | {base / seconds:.2f}x |")
    single, parallel = base / results[2][1], base / results[3][1]
    lines += [
        "",
        f"Targets: catalog single-threaded >= 0.95x sha256sum: {'met' if single >= 0.95 else 'NOT met'} "
        f"({single:.2f}x); catalog parallel faster than sha256sum: {'met' if parallel > 1 else 'NOT met'} "
        f"({parallel:.2f}x).",
        "",
    ]
    section = "\n".join(lines)
    print(HEADING + "\n\n" + section)
    if args.record:
        replace_section(args.record, HEADING, section)


if __name__ == "__main__":
    main()
