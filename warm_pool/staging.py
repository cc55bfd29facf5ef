"""The cold DR tier's promise, checked: a version's artifacts are staged where the pool loads them, and verified.

A `cold` pool (`pool.plan.tier: cold`) loads nothing beyond its serving set;
after a loss it must load from disk, so what it would load has to be there
and be the catalog's bytes *before* the loss, not found wrong at load time.
For each version of `pool.versions` that the snapshot describes for
`pool.model`, the agent hashes the directory the driver loads it from
(`pool.versions[version]`) and compares every file with the sha256 the
catalog recorded (`VersionEntry.shards`):

    verified    every recorded file present, each with its recorded sha256
    missing     a recorded file absent (or the directory itself); the first one is named
    mismatch    a file's sha256 differs from the record (named), or a recorded path leaves the directory

A snapshot from a control plane older than `VersionEntry.shards` carries
only the gateway's files (by name) and `weights_digest` (all weight shards
as one digest): then those are checked, and a weight mismatch cannot name
its shard. A version with no checksums at all is `missing`: nothing
unverifiable is called verified.

Cost: hashing reads every byte (`common.hashing` measured 0.7–0.9 GB/s on
one core of the shared development machine, 256 MiB from the page cache: a
16 GB version is ~20 s of a core, longer from a network disk), so it runs at start-up (the
first tick whose snapshot describes the version), when the catalog's
checksums for a version change, and then every `pool.staging_check_every`
(10 min), one version at a time, in a worker thread (`asyncio.to_thread`):
the probe loop never waits for it. Shards are hashed by `common.hashing`,
the code the catalog registered them with.

Each change of a version's outcome (the first one too) is one `pool.staging`
event; the last outcome of each is in the agent's report
(`AgentReport.staging`) and on /metrics
(`lifeline_agent_staged_version_verified{version}`: 1 verified, 0 not).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from prometheus_client import CollectorRegistry, Gauge

from common.clock import Clock
from common.hashing import hash_shards
from common.logs import get_logger
from contract.events import AgentStagedVersion, DataPlaneEvent, StagingOutcome
from contract.identity import WEIGHT_SUFFIX, weights_digest
from contract.snapshot import RoutingSnapshot, VersionEntry
from warm_pool.settings import PoolSettings

log = get_logger(__name__)

HASH_WORKERS = 2  # shards hashed at once: the agent shares its machine with the engines it watches


@dataclass(frozen=True)
class StagingResult:
    version: str
    outcome: StagingOutcome
    reason: str
    shard: str | None = None


class _Directory:
    """`common.hashing.ShardSource` over a local directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def open(self, path: str) -> BinaryIO:
        return (self.root / path).open("rb")


def _inside(path: str) -> bool:
    parts = PurePosixPath(path).parts
    return bool(parts) and not PurePosixPath(path).is_absolute() and ".." not in parts


def check_staged(entry: VersionEntry, directory: Path, *, workers: int = HASH_WORKERS) -> StagingResult:
    """Hash `directory` against the catalog's record of `entry`; blocking (call it in a thread)."""
    version = entry.version
    expected = {p: d.removeprefix("sha256:").lower() for p, d in (entry.shards or entry.files).items()}
    by_digest_only = not entry.shards and entry.weights_digest is not None
    if not expected and not by_digest_only:
        return StagingResult(version, "missing", "the snapshot lists no checksums for the version: nothing to "
                                                 "verify it by")
    outside = sorted(p for p in expected if not _inside(p))
    if outside:
        return StagingResult(version, "mismatch", f"the catalog records a path outside the version's directory: "
                                                  f"{outside[0]!r}; not read", shard=outside[0])
    if not directory.is_dir():
        return StagingResult(version, "missing", f"{directory} is not a directory: the version is not staged",
                             shard=min(expected) if expected else None)
    absent = sorted(p for p in expected if not (directory / p).is_file())
    if absent:
        return StagingResult(version, "missing", f"{len(absent)} of {len(expected)} recorded files absent from "
                                                 f"{directory}: {', '.join(absent[:5])}", shard=absent[0])
    source = _Directory(directory)
    for digest in hash_shards(source, sorted(expected), workers=workers):
        if digest.sha256 != expected[digest.path]:
            return StagingResult(version, "mismatch", f"{digest.path} has sha256 {digest.sha256[:16]}…, the "
                                                      f"catalog recorded {expected[digest.path][:16]}…",
                                 shard=digest.path)
    if by_digest_only:
        weights = sorted(p.relative_to(directory).as_posix() for p in directory.rglob(f"*{WEIGHT_SUFFIX}"))
        if not weights:
            return StagingResult(version, "missing", f"no *{WEIGHT_SUFFIX} shard in {directory}")
        found = weights_digest({d.path: d.sha256 for d in hash_shards(source, weights, workers=workers)})
        if found != entry.weights_digest:
            return StagingResult(version, "mismatch", f"the weights_digest of the {len(weights)} shards in "
                                 f"{directory} is not the catalog's (the snapshot names no shards, so not which "
                                 f"one differs)")
        return StagingResult(version, "verified", f"{len(expected)} files and the weights_digest of {len(weights)} "
                                                  "shards match the catalog")
    return StagingResult(version, "verified", f"{len(expected)} files match the catalog's sha256")


@dataclass(frozen=True)
class _Checked:
    staged: AgentStagedVersion
    record: tuple  # the catalog's checksums it was checked against: a change is checked again at once
    at: float  # monotonic


class StagingCheck:
    """A cold pool's versions, checked in the background; the agent calls `start()` each tick."""

    def __init__(self, pool: PoolSettings, *, region: str, actor: str, clock: Clock,
                 emit: Callable[[DataPlaneEvent], None], registry: CollectorRegistry,
                 check: Callable[[VersionEntry, Path], StagingResult] = check_staged) -> None:
        self.pool = pool
        self.region = region
        self.actor = actor
        self.clock = clock
        self.emit = emit
        self.check = check
        self.every = pool.staging_check_every
        self.checked: dict[str, _Checked] = {}
        self._task: asyncio.Task | None = None
        self.gauge = Gauge("lifeline_agent_staged_version_verified", "a cold pool's version: 1 when its staged "
                           "artifacts match the catalog at the last check, 0 when not", ["version"], registry=registry)

    def wanted(self, snapshot: RoutingSnapshot | None) -> dict[str, VersionEntry]:
        """The pool's versions the snapshot describes: the ones a loss would load, checkable by their record."""
        model = snapshot.models.get(self.pool.model) if snapshot is not None else None
        if model is None:
            return {}
        return {v: model.versions[v] for v in self.pool.versions if v in model.versions}

    def due(self, snapshot: RoutingSnapshot | None) -> dict[str, VersionEntry]:
        now = self.clock.now()
        return {v: entry for v, entry in self.wanted(snapshot).items()
                if v not in self.checked or self.checked[v].record != _record(entry)
                or now - self.checked[v].at >= self.every.total_seconds()}

    def start(self, snapshot: RoutingSnapshot | None) -> None:
        if self._task is not None and not self._task.done():
            return
        wanted = self.wanted(snapshot)
        for version in [v for v in self.checked if v not in wanted]:  # left the snapshot: nothing to say of it
            del self.checked[version]
            self.gauge.remove(version)
        due = self.due(snapshot)
        if due:
            self._task = asyncio.create_task(self._run(due), name="staging-check")

    async def wait(self) -> None:
        """Until the check under way (if any) is done: for tests and shutdown."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()  # a hash in its thread runs on to its end; its result is dropped

    async def _run(self, due: dict[str, VersionEntry]) -> None:
        for version, entry in due.items():
            directory = self.pool.versions[version]
            try:
                # Hashing GBs takes seconds to minutes: in a thread, so the probe loop never waits for it.
                result = await asyncio.to_thread(self.check, entry, directory)
            except Exception as exc:  # unreadable: not verified, and said so; the next interval tries again
                log.exception("staging check failed", version=version)
                result = StagingResult(version, "missing", f"could not read {directory}: {exc!r}"[:2000])
            self._record(entry, directory, result)

    def _record(self, entry: VersionEntry, directory: Path, result: StagingResult) -> None:
        staged = AgentStagedVersion(model=self.pool.model, version=result.version, directory=str(directory),
                                    outcome=result.outcome, shard=result.shard, reason=result.reason[:2000],
                                    checked_at=self.clock.utcnow())
        before = self.checked.get(result.version)
        self.checked[result.version] = _Checked(staged, _record(entry), self.clock.now())
        self.gauge.labels(result.version).set(1 if result.outcome == "verified" else 0)
        if before is not None and before.staged.outcome == result.outcome:
            return
        level = log.info if result.outcome == "verified" else log.error
        level("staged artifacts checked", version=result.version, outcome=result.outcome, shard=result.shard,
              reason=result.reason)
        self.emit(DataPlaneEvent(
            kind="pool.staging", actor=self.actor, region=self.region, reason=f"{self.pool.model}/{result.version} "
            f"staged at {directory}: {before.staged.outcome if before else 'unchecked'} → {result.outcome}: "
            f"{result.reason}"[:2000], at=staged.checked_at,
            detail={"model": self.pool.model, "version": result.version, "outcome": result.outcome,
                    "before": before.staged.outcome if before else None, "shard": result.shard,
                    "directory": str(directory), "changes_routing": False}))

    def report(self) -> list[AgentStagedVersion]:
        return [c.staged for _, c in sorted(self.checked.items())]


def _record(entry: VersionEntry) -> tuple:
    return tuple(sorted(entry.shards.items())), tuple(sorted(entry.files.items())), entry.weights_digest
