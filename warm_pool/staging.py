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

The check gates starts (`refusal`): the pool never starts an engine on a
version whose last check, against the catalog's present record, was
`missing` or `mismatch`. Nothing is started in its place: an instance of
another version takes none of the alias' traffic (gateways route the
alias' version), so the pool holds the start and says so — the report's
`held_starts`, `lifeline_agent_pool_held_starts{version}`, one
`pool.start_refused` event and an error log per hold. A version not
checked yet (or checked against an older record) is started: a loss-driven
start does not wait for a hash of many GB (~20 s of a core for 16 GB), and
the admission canary and the weights digest at /healthz/generation still
keep bad weights from a lease. A bad version is checked again at the next
interval, or at once when one of its files changes (inode, size or mtime: a re-sync),
so a fixed copy is started without waiting for the interval.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from prometheus_client import CollectorRegistry, Gauge

from common.clock import Clock
from common.hashing import DirectorySource, hash_shards
from common.logs import get_logger
from contract.events import AgentStagedVersion, DataPlaneEvent, StagingOutcome
from contract.identity import WEIGHT_SUFFIX, weights_digest
from contract.snapshot import RoutingSnapshot, VersionEntry
from warm_pool.settings import PoolSettings

log = get_logger(__name__)

HASH_WORKERS = 2  # shards hashed at once: the agent shares its machine with the engines it watches
REFUSED: frozenset[StagingOutcome] = frozenset({"missing", "mismatch"})


@dataclass(frozen=True)
class StagingResult:
    version: str
    outcome: StagingOutcome
    reason: str
    shard: str | None = None


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
    source = DirectorySource(directory)
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


def file_signature(entry: VersionEntry, directory: Path) -> tuple:
    """(path, (inode, size, mtime_ns)) of each recorded file, None where absent: cheap (stat only); a change
    re-checks. The inode tells a re-synced copy (written beside, renamed over) even within mtime's granularity."""
    signature = []
    for path in sorted(entry.shards or entry.files):
        try:
            stat = (directory / path).stat() if _inside(path) else None
        except OSError:
            stat = None
        signature.append((path, (stat.st_ino, stat.st_size, stat.st_mtime_ns) if stat else None))
    return tuple(signature)


@dataclass(frozen=True)
class _Checked:
    staged: AgentStagedVersion
    record: tuple  # the catalog's checksums it was checked against: a change is checked again at once
    at: float  # monotonic
    files: tuple  # file_signature before hashing: a bad version whose files change is checked again at once


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
        self.held: dict[str, dict[str, int]] = {}  # version → zone → starts refused at the last reconcile
        self._task: asyncio.Task | None = None
        self.gauge = Gauge("lifeline_agent_staged_version_verified", "a cold pool's version: 1 when its staged "
                           "artifacts match the catalog at the last check, 0 when not", ["version"], registry=registry)
        self.held_gauge = Gauge("lifeline_agent_pool_held_starts", "instances the pool refused to start on a version "
                                "whose staged artifacts are missing or mismatch, at its last reconcile", ["version"],
                                registry=registry)

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
                or now - self.checked[v].at >= self.every.total_seconds()
                or (self.checked[v].staged.outcome in REFUSED
                    and file_signature(entry, self.pool.versions[v]) != self.checked[v].files)}

    def refusal(self, version: str, snapshot: RoutingSnapshot | None) -> AgentStagedVersion | None:
        """The last check when it forbids starting `version`: missing or mismatch against the catalog's present
        record. None: verified, or not checked against that record yet (the start proceeds: see the module doc)."""
        checked, entry = self.checked.get(version), self.wanted(snapshot).get(version)
        if checked is None or entry is None or checked.record != _record(entry):
            return None
        return checked.staged if checked.staged.outcome in REFUSED else None

    def hold(self, held: Mapping[tuple[str, str], int]) -> None:
        """The reconcile's refused starts, (version, zone) → count: the report, the gauge, one event per hold."""
        now: dict[str, dict[str, int]] = {}
        for (version, zone), count in held.items():
            now.setdefault(version, {})[zone] = count
        for version in set(self.held) | set(now):
            zones = now.get(version, {})
            self.held_gauge.labels(version).set(sum(zones.values()))
            if version in self.held and not zones:
                log.info("pool starts no longer held", model=self.pool.model, version=version)
            if zones and version not in self.held:
                self._refused(version, zones)
        self.held = now

    def _refused(self, version: str, zones: dict[str, int]) -> None:
        staged = self.checked[version].staged
        count = sum(zones.values())
        log.error("pool start refused: staged artifacts are not the catalog's", model=self.pool.model,
                  version=version, outcome=staged.outcome, shard=staged.shard, held=count, zones=sorted(zones))
        self.emit(DataPlaneEvent(
            kind="pool.start_refused", actor=self.actor, region=self.region, at=self.clock.utcnow(),
            reason=f"{count} start(s) of {self.pool.model}/{version} held in {', '.join(sorted(zones))}: staged at "
            f"{staged.directory}: {staged.outcome}: {staged.reason}; nothing started in its place, the plan is "
            f"short until a check verifies it"[:2000],
            detail={"model": self.pool.model, "version": version, "outcome": staged.outcome, "shard": staged.shard,
                    "held": count, "zones": ",".join(sorted(zones)), "directory": staged.directory,
                    "changes_routing": False}))

    def start(self, snapshot: RoutingSnapshot | None) -> None:
        if self._task is not None and not self._task.done():
            return
        wanted = self.wanted(snapshot)
        for version in [v for v in self.checked if v not in wanted]:  # left the snapshot: nothing to say of it
            del self.checked[version]
            self.gauge.remove(version)
            with contextlib.suppress(KeyError):  # never held: no series
                self.held_gauge.remove(version)
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
            files = await asyncio.to_thread(file_signature, entry, directory)  # before: a change while hashing counts
            try:
                # Hashing GBs takes seconds to minutes: in a thread, so the probe loop never waits for it.
                result = await asyncio.to_thread(self.check, entry, directory)
            except Exception as exc:  # unreadable: not verified, and said so; the next interval tries again
                log.exception("staging check failed", version=version)
                result = StagingResult(version, "missing", f"could not read {directory}: {exc!r}"[:2000])
            self._record(entry, directory, result, files)

    def _record(self, entry: VersionEntry, directory: Path, result: StagingResult, files: tuple) -> None:
        staged = AgentStagedVersion(model=self.pool.model, version=result.version, directory=str(directory),
                                    outcome=result.outcome, shard=result.shard, reason=result.reason[:2000],
                                    checked_at=self.clock.utcnow())
        before = self.checked.get(result.version)
        self.checked[result.version] = _Checked(staged, _record(entry), self.clock.now(), files)
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
        return [c.staged.model_copy(update={"held_starts": sum(self.held.get(v, {}).values())})
                for v, c in sorted(self.checked.items())]


def _record(entry: VersionEntry) -> tuple:
    return tuple(sorted(entry.shards.items())), tuple(sorted(entry.files.items())), entry.weights_digest
