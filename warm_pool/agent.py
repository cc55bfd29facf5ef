"""The regional agent: a controller that reconciles the region's engines with the snapshot, off the request path.

One loop per `probe_interval` (Kubernetes-controller style: observe, compare, act, report):

    snapshot    poll the control plane (ETag); keep the last good one, on disk, while it is away
    observe     live leases in the region's registry; engines named in `renew_leases_for`; pool instances
    probe       live / ready / generation on every instance (cheap GETs, concurrent, each bounded by
                probe_timeout); canaries under the probe budget, in the background
    judge       one verdict per instance (a failing health level, else the last canary); a change is a
                `probe.verdict` event, routing_tier l7
    publish     the verdicts that change routing (not ok) to the region's Redis beside the leases
                (`contract.verdict`): gateways eject, de-weight or stop new sessions by them, also on
                engines that renew their own leases
    report      the whole picture (`contract.events.AgentReport`: per instance verdict, pool state, lease,
                last canary) to `PUT /api/v1/agents/{region}`, each replacing the last
    leases      for engines that cannot renew their own (stock vLLM, pool instances): register after the
                admission canary, renew while the verdict keeps them routable, release at once on
                timeout / error / wrong_output / draining, so they leave routing within one TTL at most
    pool        a lost or ejected instance is stopped and replaced; serving short of the plan promotes a
                warm instance (a lease: routing, not a load; a `pool.promoted` event), preferring the
                short zone; each zone is backfilled to serving + warm from cold (warm_pool/reconciler.py)
    faults      a whole zone (or the region) failing for `fault_rounds` rounds is one fault, posted once to
                `POST /api/v1/cutover-escalations` in the background with its evidence (warm_pool/fault.py)
    rollback    a version a non-prod alias names that failed its canary on every instance that answered one
                is posted once per alias revision to the catalog, which rolls the alias back
                (warm_pool/canary_rollback.py)

An instance's admission canary (a loading pool instance, an external engine
before its first lease, any instance about to be leased again after a release,
a lapse or a restart) runs at once and outside the budget.
Engines that renew their own leases are probed and reported on; the agent
does not touch their leases (the control plane ejects them through the
snapshot, on the agent's events).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from datetime import datetime

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge

from common.clock import Clock, SystemClock
from common.logs import get_logger
from contract.canary import CanaryRecord
from contract.events import AgentInstance, AgentReport, DataPlaneEvent
from contract.identity import EngineIdentity
from contract.lease import Lease, LeaseExpired, LeaseRegistry, Registration, StaleGeneration
from contract.snapshot import RoutingSnapshot
from contract.snapshot_client import SnapshotClient
from contract.verdict import InstanceVerdict, RedisVerdictBoard, VerdictBoard
from warm_pool.budget import ProbeBudget
from warm_pool.canary_rollback import CanaryFailure, CanaryOutcome, CanaryRollbackReporter, failed_versions
from warm_pool.driver import PoolDriver
from warm_pool.events import EventShipper
from warm_pool.fault import Fault, FaultDetector, FaultReporter, Observation, RoundResult
from warm_pool.probe import EJECT, ProbeResult, Prober, Verdict
from warm_pool.progress import judge_progress
from warm_pool.support import SupportUnknown, UnsupportedEngine, ask_sampling, check_token_ids
from warm_pool.report import ReportSender
from warm_pool.instance import Instance
from warm_pool.reconciler import PoolReconciler
from warm_pool.settings import AgentSettings, ExternalEngine
from warm_pool.staging import StagingCheck
from warm_pool.states import InstanceState

log = get_logger(__name__)

KEEPS_LEASE = frozenset({Verdict.OK, Verdict.OVERLOADED, Verdict.OLD_GENERATION})
PROBE_RATE_WINDOW_S = 60.0  # lifeline_agent_inference_probe_rate_per_second averages over this


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.probes = Counter("lifeline_agent_probes", "health probes by verdict", ["verdict"], registry=self.registry)
        self.canaries = Counter("lifeline_agent_inference_probes", "canaries sent (inference probes)", ["verdict"],
                                registry=self.registry)
        self.budget = Gauge("lifeline_agent_inference_probe_budget_per_second", "inference probes/s the region may "
                            "spend", registry=self.registry)
        self.probe_rate = Gauge("lifeline_agent_inference_probe_rate_per_second", "inference probes/s sent over the "
                                f"last {PROBE_RATE_WINDOW_S:g} s, admission canaries too", registry=self.registry)
        self.instances = Gauge("lifeline_agent_pool_instances", "pool instances", ["zone", "state"],
                               registry=self.registry)
        self.leases = Gauge("lifeline_agent_leases_held", "leases the agent holds", registry=self.registry)
        self.instance_canaries = Gauge("lifeline_agent_instance_canaries", "canaries one instance has answered",
                                       ["instance"], registry=self.registry)
        self.instance_wrong_outputs = Gauge("lifeline_agent_instance_wrong_outputs", "canaries one instance "
                                            "answered with other tokens than the record (wrong weights)",
                                            ["instance"], registry=self.registry)
        self.unsupported = Counter("lifeline_agent_unsupported_engines", "instances refused a lease at the "
                                   "first-lease check: no per-token ids in their streams", registry=self.registry)
        self.board = Gauge("lifeline_agent_published_verdicts", "instances on the last verdict board by verdict",
                           ["verdict"], registry=self.registry)
        self.board_failures = Counter("lifeline_agent_verdict_board_failures", "verdict boards not published",
                                      registry=self.registry)
        self.reports = Counter("lifeline_agent_reports", "reports to the control plane by outcome", ["outcome"],
                               registry=self.registry)
        self.faults = Counter("lifeline_agent_faults_detected", "zone and region faults opened", ["kind"],
                              registry=self.registry)
        self.fault_reports = Counter("lifeline_agent_fault_reports", "faults posted to cutover-escalations by "
                                     "outcome", ["outcome"], registry=self.registry)
        self.canary_rollbacks = Counter("lifeline_agent_canary_rollback_reports", "failed canary versions posted "
                                        "to the catalog by outcome", ["outcome"], registry=self.registry)
        self.open_faults = Gauge("lifeline_agent_open_faults", "zone and region faults open now", ["kind"],
                                 registry=self.registry)
        self.roll_waiting = Gauge("lifeline_agent_roll_waiting_instances", "instances of another version the "
                                  "version roll would retire, waiting for their requests to finish",
                                  registry=self.registry)
        self.roll_retired = Counter("lifeline_agent_roll_retired", "instances of another version the roll retired: "
                                    "idle (no request in flight) or cut (old_generation_drain_timeout passed)",
                                    ["drain"], registry=self.registry)


class Agent:
    def __init__(self, settings: AgentSettings, *, registry: LeaseRegistry, http: httpx.AsyncClient,
                 clock: Clock | None = None, driver: PoolDriver | None = None, shipper: EventShipper | None = None,
                 snapshots: SnapshotClient | None = None, canary_records: dict[str, CanaryRecord] | None = None,
                 budget: ProbeBudget | None = None, reporter: ReportSender | None = None,
                 agent_id: str | None = None, verdict_board: RedisVerdictBoard | None = None,
                 fault_reporter: FaultReporter | None = None,
                 rollback_reporter: CanaryRollbackReporter | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.http = http
        self.clock = clock or SystemClock()
        self.driver = driver
        self.shipper = shipper or EventShipper(None, None)
        self.snapshots = snapshots
        self.canary_records = canary_records or {}
        self.prober = Prober(http, clock=self.clock)
        self.budget = budget or ProbeBudget(self.clock, per_instance_per_s=settings.canary_per_instance_per_s,
                                            jitter=settings.canary_jitter,
                                            served_credit_intervals=settings.canary_served_credit_intervals)
        self.metrics = AgentMetrics()
        self.instances: dict[str, Instance] = {}
        self.actor = f"agent:{settings.region}"
        self.reporter = reporter or ReportSender(None, None)
        self.verdict_board = verdict_board
        self.agent_id = agent_id or settings.agent_id or self.actor
        self._seq = 0  # orders canaries against releases (virtual time may not move between them)
        self.faults = FaultDetector(settings.region, rounds=settings.fault_rounds,
                                    clear_rounds=settings.fault_clear_rounds, source=self.actor)
        self.fault_reporter = fault_reporter or FaultReporter(None, None)
        self.fault_outcomes: dict[str, tuple[str, object]] = {}  # fault id → (outcome, the answer), reported ones
        self._unreported: dict[str, Fault] = {}  # opened, not yet accepted or refused
        self.lost_this_round: list[Observation] = []  # lost this round: gone, for the fault detector
        self._fault_task: asyncio.Task | None = None
        self.rollback_reporter = rollback_reporter or CanaryRollbackReporter(None, None)
        self.rollback_outcomes: dict[tuple[str, str, int], tuple[str, object]] = {}  # alias revision → outcome
        self._rollback_task: asyncio.Task | None = None
        self._canaries_sent: collections.deque[float] = collections.deque()  # when, within PROBE_RATE_WINDOW_S
        pool = settings.pool
        # the cold tier's promise (artifacts staged and verified, not loaded), checked in the background
        self.staging = StagingCheck(pool, region=settings.region, actor=self.actor, clock=self.clock,
                                    emit=lambda event: self.shipper.emit(event), registry=self.metrics.registry) \
            if pool is not None and pool.tier == "cold" else None
        self.reconciler = PoolReconciler(self)  # the warm pool: backfill, promote, rebalance, the version roll

    # -- desired state -------------------------------------------------------------------------------
    @property
    def snapshot(self) -> RoutingSnapshot | None:
        return self.snapshots.current if self.snapshots else None

    def expected_versions(self) -> frozenset[str] | None:
        """The versions the snapshot's aliases point to; None before any snapshot (no generation check)."""
        if self.snapshot is None:
            return None
        return frozenset(a.version for m in self.snapshot.models.values() for a in m.aliases.values())

    def expected_digests(self) -> dict[str, str]:
        if self.snapshot is None:
            return {}
        return {v.version: v.weights_digest for m in self.snapshot.models.values() for v in m.versions.values()
                if v.weights_digest}

    def canary_for(self, version: str) -> CanaryRecord | None:
        if self.snapshot is not None:
            for model in self.snapshot.models.values():
                entry = model.versions.get(version)
                if entry is not None and entry.canary is not None:
                    return entry.canary
        return self.canary_records.get(version)

    def desired_version(self) -> str | None:
        return self.reconciler.desired_version()

    def credit_served(self, served: dict[str, datetime]) -> None:
        """Count a gateway-reported success (wall time) as a canary at that moment (monotonic)."""
        now, wall = self.clock.now(), self.clock.utcnow()
        for instance_id, at in served.items():
            if instance_id in self.instances:
                self.budget.note_served(instance_id, now - (wall - at).total_seconds())

    # -- the loop ------------------------------------------------------------------------------------
    async def tick(self) -> None:
        if not self.reconciler.adopted:
            await self.reconciler.adopt_pool()  # before observe: their leases are the pool's, not engines' own
        await self.observe()
        await self.probe_health()
        self.start_canaries()
        await self.apply_leases()
        await self.reconciler.reconcile_pool()
        await self.publish_verdicts()
        self.detect_faults()
        self.report_faults()
        self.report_canary_failures()
        if self.staging is not None:
            self.staging.start(self.snapshot)
        self.export_metrics()

    async def run_ticks(self, stop: asyncio.Event) -> None:
        """Tick every probe interval until `stop` is set: for tests and benches that drive the agent in their loop.

        Stopped by an event, not by cancelling alone: on Python 3.11 `asyncio.wait_for` (the health probes)
        can swallow a cancellation that lands as its inner call completes, and a loop stopped only by
        `cancel()` then ticks on forever (bench/pool.py hung so).
        """
        while not stop.is_set():
            await self.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.probe_interval.total_seconds())

    async def observe(self) -> None:
        now = self.clock.now()
        leases = {lease.instance_id: lease for lease in await self.registry.live()}
        ours = {engine.url.rstrip("/") for engine in self.settings.renew_leases_for}
        for instance_id, lease in leases.items():
            if instance_id not in self.instances and lease.url.rstrip("/") not in ours:
                self.instances[instance_id] = Instance(instance_id, lease.url, lease.zone, lease.version,
                                                       "registry", first_seen=now)
            if instance_id in self.instances and self.instances[instance_id].origin == "registry":
                self.instances[instance_id].generation = lease.generation
        for instance_id, instance in list(self.instances.items()):
            if instance.origin == "registry" and instance_id not in leases:
                self.forget(instance_id)  # its own lease lapsed or was released: not ours to act on
        known_urls = {i.url for i in self.instances.values()}
        held = {lease.url.rstrip("/"): lease for lease in leases.values()}
        for engine in self.settings.renew_leases_for:
            if engine.url.rstrip("/") not in known_urls:
                await self._adopt(engine, now, held.get(engine.url.rstrip("/")))

    async def _adopt(self, engine: ExternalEngine, now: float, live: Lease | None = None) -> None:
        """Track an engine the agent leases for; a live lease for its url (a restarted agent's) is taken over."""
        url = engine.url.rstrip("/")
        if live is not None:
            self.instances[live.instance_id] = Instance(live.instance_id, url, live.zone, live.version, "external",
                                                        now, lease=live)
            return
        instance_id, version, zone = engine.instance_id, engine.version, engine.zone
        stock_vllm = False
        if None in (instance_id, version, zone):
            try:
                response = await self.http.get(f"{url}/healthz/generation")
                stock_vllm = response.status_code == 404
                identity = EngineIdentity.model_validate_json(response.content) if response.is_success else None
            except (httpx.TransportError, ValueError):
                identity = None
            if identity is not None:
                instance_id = instance_id or identity.instance_id
                version = version or identity.model
                zone = zone or identity.zone
            elif stock_vllm:
                # Stock vLLM says nothing about itself: its identity is the agent's configuration, and what
                # the configuration leaves out comes from the URL and the OpenAI API (the served model name).
                instance_id = instance_id or instance_id_from_url(url)
                version = version or await self._served_model(url)
                if zone is None:
                    log.warning("engine leased with zone unknown: give renew_leases_for its zone (url, "
                                "instance_id, version, zone) for zone-loss detection", url=url, instance=instance_id)
            if instance_id is None or version is None:
                log.info("engine to lease for does not answer yet", url=url)
                return
        self.instances[instance_id] = Instance(instance_id, url, zone or "unknown", version, "external", now,
                                               stock_vllm=stock_vllm)

    async def _served_model(self, url: str) -> str | None:
        """The one model an OpenAI server lists (`/v1/models`): stock vLLM's `--served-model-name`, the version."""
        try:
            names = [m["id"] for m in (await self.http.get(f"{url}/v1/models")).raise_for_status().json()["data"]]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        if len(names) != 1:
            log.error("engine serves several models: name its version in renew_leases_for", url=url, models=names)
            return None
        return str(names[0])

    async def probe_health(self) -> None:
        timeout = self.settings.probe_timeout.total_seconds()
        versions, digests = self.expected_versions(), self.expected_digests()
        targets = list(self.instances.values())

        async def one(instance: Instance) -> ProbeResult:
            metrics = self._read_progress(instance) if instance.stock_vllm else None
            try:
                result = await asyncio.wait_for(self.prober.health(instance.url, expected_versions=versions,
                                                                   expected_digests=digests,
                                                                   stock_vllm=instance.stock_vllm), timeout)
            except TimeoutError:
                result = ProbeResult(Verdict.TIMEOUT, "live", f"health probes took over {timeout:g} s",
                                     stock_vllm=instance.stock_vllm)
            if result.stock_vllm and metrics is None:
                metrics = self._read_progress(instance)  # just found out it is stock vLLM
            if metrics is not None:
                # the /metrics read may outlive this probe (a busy API server): wait for it no longer than
                # the health probe may take, and judge by the freshest sample there is
                await asyncio.wait({metrics}, timeout=max(0.0, timeout - (self.clock.now() - started)))
                result = judge_progress(result, instance.progress, now=self.clock.now(),
                                        stall_timeout=self.settings.stall_timeout.total_seconds(),
                                        busy_grace=self.settings.busy_grace.total_seconds())
            return result

        async def in_flight(instance: Instance) -> None:
            """For the version roll: it retires an old instance once nothing runs or waits there."""
            try:
                instance.in_flight = await asyncio.wait_for(self.prober.in_flight(instance.url), timeout)
            except TimeoutError:
                instance.in_flight = None

        awaited = [i for i in targets if i.drain_waiting_since is not None]
        started = self.clock.now()
        results, _ = await asyncio.gather(asyncio.gather(*(one(i) for i in targets)),
                                          asyncio.gather(*(in_flight(i) for i in awaited)))
        for instance, result in zip(targets, results, strict=True):
            instance.health = result
            instance.stock_vllm = instance.stock_vllm or result.stock_vllm
            instance.failed_probes = 0 if result.ok or result.verdict is Verdict.OVERLOADED \
                else instance.failed_probes + 1
            if result.identity is not None and result.identity.model != instance.version:
                instance.version = result.identity.model
            boot = None
            if result.identity is not None:
                boot = (result.identity.boot_generation, result.identity.started_at)
            elif instance.stock_vllm and instance.progress.last is not None and \
                    instance.progress.last.started_at is not None:
                boot = (0, instance.progress.last.started_at)  # vLLM's process_start_time_seconds
            if boot is not None:
                if instance.boot is not None and boot != instance.boot:
                    await self._restarted(instance, instance.boot, boot)
                instance.boot = boot
            self.metrics.probes.labels(result.verdict.value).inc()
            self.judge(instance)

    def _read_progress(self, instance: Instance) -> asyncio.Task:
        """The instance's /metrics read in flight, or a new one; each finished read is added to its progress.

        Not bounded by the probe timeout: a busy API server answers late, and a late sample is still
        evidence of progress. Bounded by `busy_grace`, past which a sample proves nothing anyway.
        """
        task = instance.metrics_task
        if task is not None and not task.done():
            return task

        async def read() -> None:
            sample = await self.prober.engine_metrics(instance.url, timeout=self.settings.busy_grace.total_seconds())
            if sample is not None:
                instance.progress.add(sample)

        instance.metrics_task = asyncio.create_task(read(), name=f"metrics-{instance.instance_id}")
        return instance.metrics_task

    async def _restarted(self, instance: Instance, before: tuple[int, float], after: tuple[int, float]) -> None:
        """Another process answers at the instance's url: release its lease; a new one only after a fresh canary.

        An engine without a lease of its own sends no generation header, so the gateway cannot fence a
        restart at the same url; the lease holder does, from `boot_generation` and `started_at`.
        """
        log.warning("engine restarted under its lease", instance=instance.instance_id, before=before, after=after)
        if instance.canary_task is not None:
            instance.canary_task.cancel()  # its answer may be the old process's
            instance.canary_task = None
        instance.canary = None
        instance.unleasable = None
        instance.supported = False  # another process: it may be another vLLM, with or without Lifeline's sampler
        await self.release(instance)
        self._seq += 1
        instance.released_seq = self._seq

    def start_canaries(self) -> None:
        admission, routine = [], []
        for instance in self.instances.values():
            if instance.canary_task is not None or self.canary_for(instance.version) is None:
                continue
            if instance.health is None or not instance.health.ok:
                continue
            (admission if self._needs_admission(instance) else routine).append(instance)
        budgeted = [i for i in self.instances.values() if self.canary_for(i.version) is not None]
        self.metrics.budget.set(self.budget.rate(len(budgeted)))
        due = set(self.budget.due([i.instance_id for i in budgeted]))
        now = self.clock.now()
        for instance in admission + [i for i in routine if i.instance_id in due]:
            instance.canary_task = asyncio.create_task(self._run_canary(instance),
                                                       name=f"canary-{instance.instance_id}")
            self._canaries_sent.append(now)
        while self._canaries_sent and self._canaries_sent[0] <= now - PROBE_RATE_WINDOW_S:
            self._canaries_sent.popleft()
        self.metrics.probe_rate.set(len(self._canaries_sent) / PROBE_RATE_WINDOW_S)

    def _needs_admission(self, instance: Instance) -> bool:
        """An admission canary (at once, outside the budget): a loading instance, or one the agent would lease
        that has no passing canary since its last lease went. A failing one waits for routine canaries."""
        if instance.state is InstanceState.COLD:
            return True
        if instance.lease is not None or instance.origin == "registry" or self._fresh_canary(instance):
            return False
        if instance.canary is None:
            return instance.origin == "external" or instance.released_seq is not None
        return instance.canary.ok

    def _fresh_canary(self, instance: Instance) -> bool:
        """A canary has answered since the agent last let the instance's lease go."""
        return instance.canary is not None and (instance.released_seq is None or
                                                instance.canary_seq > instance.released_seq)

    async def _run_canary(self, instance: Instance) -> None:
        record = self.canary_for(instance.version)
        self._seq += 1
        started = self._seq
        try:
            if record is None:
                return
            result = await self.prober.canary(instance.url, model=instance.version, record=record,
                                              timeout=self._canary_timeout())
            instance.canary, instance.canary_seq = result, started
            instance.canary_at = self.clock.utcnow()
            instance.canaries += 1
            self.metrics.instance_canaries.labels(instance.instance_id).set(instance.canaries)
            if result.verdict is Verdict.WRONG_OUTPUT:
                instance.wrong_outputs += 1
                self.metrics.instance_wrong_outputs.labels(instance.instance_id).set(instance.wrong_outputs)
            self.metrics.canaries.labels(result.verdict.value).inc()
            self.judge(instance)
            if instance.verdict in EJECT | {Verdict.DRAINING} and instance.lease is not None:
                await self.release(instance)  # at once, not at the next tick
        except Exception:  # a canary never takes the agent down
            log.exception("canary failed", instance=instance.instance_id)
        finally:
            if instance.canary_task is asyncio.current_task():
                instance.canary_task = None

    def judge(self, instance: Instance) -> None:
        health, canary = instance.health, instance.canary
        if health is None:
            return
        if not health.ok:
            verdict, reason, level = health.verdict, health.reason, health.level
        elif canary is not None and not canary.ok:
            verdict, reason, level = canary.verdict, canary.reason, canary.level
        else:
            verdict, reason, level = Verdict.OK, (canary or health).reason, (canary or health).level
        before = instance.verdict
        instance.reason = reason
        if verdict is before:
            return
        instance.verdict = verdict
        instance.verdict_since = self.clock.utcnow()
        if instance.state is InstanceState.COLD and verdict is not Verdict.OK and level != "canary":
            return  # still loading: not a change anyone routes on
        self.emit("probe.verdict", instance, f"{before or 'unprobed'} → {verdict}: {reason}",
                  verdict=verdict.value, before=before.value if before else None, level=level,
                  canary_probes=instance.canaries, seen_for_s=round(self.clock.now() - instance.first_seen, 3),
                  origin=instance.origin, version=instance.version,
                  changes_routing=_routing_class(before) != _routing_class(verdict))

    async def apply_leases(self) -> None:
        for instance in list(self.instances.values()):
            if not instance.agent_leased:
                continue
            if instance.lease is not None and instance.verdict not in KEEPS_LEASE:
                await self.release(instance)
            elif instance.lease is not None:
                await self._renew(instance)
            elif self.admitted(instance) and instance.unleasable is None:
                await self.register(instance)  # first lease, or again after a release or a lapse

    def admitted(self, instance: Instance) -> bool:
        """Routable now, and (with a canary record) a canary passed since the agent last held its lease."""
        if instance.verdict is not Verdict.OK:
            return False
        record = self.canary_for(instance.version)
        return record is None or (self._fresh_canary(instance) and instance.canary is not None and instance.canary.ok)

    def _canary_timeout(self) -> httpx.Timeout:
        """A canary's own timeouts: a busy engine accepts and answers late, which is overloaded, not dead."""
        canary = self.settings.canary_timeout.total_seconds()
        return httpx.Timeout(connect=min(2.0, canary), read=canary, write=canary, pool=canary)

    async def supported(self, instance: Instance) -> bool:
        """The first-lease check (warm_pool/support.py), once per instance: it streams per-token ids.

        Refused: `unleasable` names what is missing and the minimum vLLM version, an event and an error log
        say so, and it is never leased. No answer to judge (a timeout, a 5xx): not leased now, asked again.
        """
        if instance.supported:
            return True
        if instance.unleasable is not None:
            return False
        try:
            await check_token_ids(self.http, instance.url, model=instance.version, timeout=self._canary_timeout())
            instance.sampling = await ask_sampling(self.http, instance.url, model=instance.version,
                                                   timeout=self._canary_timeout())
        except UnsupportedEngine as exc:
            instance.unleasable = f"{exc.error_type}: {exc.message}"
            instance.reason = instance.unleasable
            self.metrics.unsupported.inc()
            log.error("engine refused: it cannot be leased", instance=instance.instance_id, url=instance.url,
                      error_type=exc.error_type, reason=exc.message)
            self.emit("probe.verdict", instance, f"refused at its first lease: {instance.unleasable}",
                      verdict=Verdict.ERROR.value, before=instance.verdict.value if instance.verdict else None,
                      level="canary", error_type=exc.error_type, changes_routing=False)
            return False
        except SupportUnknown as exc:
            log.info("first-lease check got no answer; asking again before the next lease",
                     instance=instance.instance_id, why=str(exc))
            return False
        instance.supported = True
        log.info("engine supported", instance=instance.instance_id, sampling=instance.sampling.value)
        return True

    async def register(self, instance: Instance) -> None:
        if not await self.supported(instance):
            return
        try:
            instance.lease = await self.registry.register(Registration(
                instance_id=instance.instance_id, url=instance.url, version=instance.version, zone=instance.zone,
                region=self.settings.region, sampling=instance.sampling.value))
        except Exception as exc:
            log.warning("lease not registered", instance=instance.instance_id, error=str(exc)[:200])
            return
        log.info("lease registered for", instance=instance.instance_id, generation=instance.lease.generation)
        health = instance.health
        identity = health.identity if health else None
        if health is not None and health.stamps_generation and identity is not None and \
                identity.generation != instance.lease.generation:
            # It sends X-Lifeline-Generation: it holds a lease of its own and is listed here by mistake. The
            # gateway would drop every frame under the agent's generation as stale. Never route to it.
            # (An engine without a lease of its own sends no header and is leased under any generation.)
            instance.unleasable = (f"engine stamps generation {identity.generation} (a lease of its own); "
                                   f"the agent's lease would be {instance.lease.generation}")
            await self.release(instance)
            log.warning("lease refused: generations disagree", instance=instance.instance_id,
                        reason=instance.unleasable)

    async def _renew(self, instance: Instance) -> None:
        if instance.lease is None:
            return
        try:
            instance.lease = await self.registry.renew(instance.instance_id, instance.lease.generation)
        except LeaseExpired:
            # Lapsed while the agent was slow: gateways stopped routing to it. Registered again (a new
            # generation) after a fresh admission canary; the engine sends no generation header to disagree.
            log.warning("lease lapsed", instance=instance.instance_id, generation=instance.lease.generation)
            instance.lease = None
            self._seq += 1
            instance.released_seq = self._seq
        except StaleGeneration:
            log.warning("another writer holds this instance's lease; not renewing", instance=instance.instance_id)
            instance.lease = None
            self._seq += 1
            instance.released_seq = self._seq
        except Exception as exc:  # registry away: the lease lapses on its own, which is the safe side
            log.warning("lease not renewed", instance=instance.instance_id, error=str(exc)[:200])

    async def release(self, instance: Instance) -> None:
        lease, instance.lease = instance.lease, None
        if lease is None:
            return
        self._seq += 1
        instance.released_seq = self._seq
        with contextlib.suppress(Exception):
            await self.registry.release(lease.instance_id, lease.generation)
        log.info("lease released", instance=instance.instance_id, generation=lease.generation, verdict=instance.verdict)

    # -- zone and region faults ---------------------------------------------------------------------
    def detect_faults(self) -> RoundResult:
        """One round for the fault detector: every instance's verdict, and the ones lost this round as gone."""
        observations = [Observation(i.instance_id, i.zone, i.verdict.value if i.verdict else None, i.reason,
                                    i.lease.generation if i.lease else i.generation)
                        for i in self.instances.values()] + self.lost_this_round
        self.lost_this_round = []
        result = self.faults.observe(observations, self.clock.utcnow())
        for fault in result.opened:
            self.metrics.faults.labels(fault.kind).inc()
            self._unreported[fault.fault_id] = fault
            log.warning("fault detected", fault_id=fault.fault_id, scope=fault.scope, rounds=fault.evidence["rounds"],
                        instances=[i["instance_id"] for i in fault.evidence["instances"]])
        for fault in result.cleared:
            self._unreported.pop(fault.fault_id, None)
            log.info("fault cleared", fault_id=fault.fault_id, scope=fault.scope)
        self.metrics.open_faults.clear()
        for entry in self.faults.open.values():
            self.metrics.open_faults.labels(entry.fault.kind).inc()
        return result

    def report_faults(self) -> None:
        """Post the faults not yet taken, in the background: the answer waits for the cutover it starts."""
        if self._unreported and (self._fault_task is None or self._fault_task.done()):
            self._fault_task = asyncio.create_task(self._send_faults(list(self._unreported.values())),
                                                   name="fault-reports")

    async def _send_faults(self, faults: list[Fault]) -> None:
        for fault in faults:
            if fault.fault_id not in self._unreported:
                continue  # cleared meanwhile: no cutover for a fault that is gone
            try:
                outcome, answer = await self.fault_reporter.send(fault)
            except Exception as exc:  # a report never takes the agent down; the next round tries again
                log.exception("fault report failed", fault_id=fault.fault_id)
                outcome, answer = "retry", repr(exc)[:300]
            self.metrics.fault_reports.labels(outcome).inc()
            if outcome == "retry":
                log.info("fault not reported yet; the same id again resumes its ladder", fault_id=fault.fault_id,
                         why=answer)
                continue
            self._unreported.pop(fault.fault_id, None)
            self.fault_outcomes[fault.fault_id] = (outcome, answer)
            if outcome == "accepted":
                actions = [d.get("action") for d in (answer or {}).get("decisions", [])] if isinstance(answer, dict) \
                    else []
                log.warning("fault reported for automatic cutover", fault_id=fault.fault_id, scope=fault.scope,
                            actions=actions)
            elif outcome == "disabled":
                log.warning("fault not reported: no control plane is configured", fault_id=fault.fault_id,
                            scope=fault.scope)
            else:
                log.error("fault not reported", fault_id=fault.fault_id, scope=fault.scope, outcome=outcome,
                          why=answer)

    # -- a bad version on a non-prod alias ----------------------------------------------------------
    def canary_failures(self) -> list[CanaryFailure]:
        """Non-prod aliases whose version failed its canary on every instance of it that answered one."""
        outcomes = [CanaryOutcome(i.instance_id, i.version, i.canary.verdict.value, i.canary.reason)
                    for i in self.instances.values() if i.canary is not None]
        return [f for f in failed_versions(self.snapshot, outcomes) if f.key not in self.rollback_outcomes]

    def report_canary_failures(self) -> None:
        """Post them in the background (one at a time): the catalog answers once the alias has moved."""
        if not self.settings.canary_rollback or (self._rollback_task is not None and not self._rollback_task.done()):
            return
        failures = self.canary_failures()
        if failures:
            self._rollback_task = asyncio.create_task(self._send_canary_failures(failures), name="canary-rollbacks")

    async def _send_canary_failures(self, failures: list[CanaryFailure]) -> None:
        for failure in failures:
            try:
                outcome, answer = await self.rollback_reporter.send(failure)
            except Exception as exc:  # a report never takes the agent down; the next round tries again
                log.exception("canary failure report failed", alias=failure.alias, version=failure.version)
                outcome, answer = "retry", repr(exc)[:300]
            self.metrics.canary_rollbacks.labels(outcome).inc()
            if outcome == "retry":
                log.info("canary failure not reported yet", alias=failure.alias, version=failure.version, why=answer)
                continue
            self.rollback_outcomes[failure.key] = (outcome, answer)
            level = log.warning if outcome == "accepted" else log.error if outcome == "refused" else log.info
            level("canary failure reported: alias rolled back" if outcome == "accepted" else
                  "canary failure not acted on", model=failure.model, alias=failure.alias, version=failure.version,
                  revision=failure.revision, instances=list(failure.instances), outcome=outcome, answer=str(answer)[:300])

    def forget(self, instance_id: str) -> None:
        """Stop tracking it; its per-instance series go too (a pool's instance ids never come back)."""
        instance = self.instances.pop(instance_id, None)
        if instance is not None:
            for task in (instance.canary_task, instance.metrics_task):
                if task is not None:
                    task.cancel()
        for series in (self.metrics.instance_canaries, self.metrics.instance_wrong_outputs):
            with contextlib.suppress(KeyError):  # never canaried (or never wrong): no series
                series.remove(instance_id)

    # -- reporting -----------------------------------------------------------------------------------
    def emit(self, kind: str, instance: Instance, reason: str, **detail: str | int | float | bool | None) -> None:
        self.shipper.emit(DataPlaneEvent(
            kind=kind, routing_tier="l7", actor=self.actor, region=self.settings.region,  # type: ignore[arg-type]
            instance_id=instance.instance_id, generation=instance.lease.generation if instance.lease else None,
            reason=reason[:2000], at=self.clock.utcnow(),
            detail={"zone": instance.zone, "version": instance.version, **detail}))

    def export_metrics(self) -> None:
        self.metrics.leases.set(sum(1 for i in self.instances.values() if i.lease is not None))
        if self.settings.pool is not None:
            self.metrics.instances.clear()
            for instance in self.instances.values():
                if instance.origin == "pool" and instance.state is not None:
                    self.metrics.instances.labels(instance.zone, instance.state.value).inc()

    def verdicts(self) -> VerdictBoard:
        """The board gateways route by: every routed instance whose verdict is not ok, under its generation.

        An instance without a lease is left out: nothing routes to it anyway (the agent released it, or it lapsed).
        """
        named = []
        for i in self.instances.values():
            generation = i.lease.generation if i.lease is not None else i.generation if i.origin == "registry" else None
            if i.verdict is None or i.verdict is Verdict.OK or generation is None:
                continue
            named.append(InstanceVerdict(instance_id=i.instance_id, generation=generation, verdict=i.verdict.value,
                                         reason=i.reason[:500], since=i.verdict_since))
        return VerdictBoard(region=self.settings.region, agent_id=self.agent_id, published_at=self.clock.utcnow(),
                            verdicts=named)

    async def publish_verdicts(self) -> None:
        """Replace the region's board; it lapses one lease TTL after the last, as the agent's leases do."""
        if self.verdict_board is None:
            return
        board = self.verdicts()
        try:
            await self.verdict_board.publish(board, ttl=self.settings.lease_ttl)
        except Exception as exc:  # Redis away: the last board lapses on its own, the safe side (leases alone)
            self.metrics.board_failures.inc()
            log.warning("verdict board not published", error=str(exc)[:200])
            return
        self.metrics.board.clear()
        for v in board.verdicts:
            self.metrics.board.labels(v.verdict).inc()

    def report(self) -> AgentReport:
        """What the agent sees now, for the control plane (`PUT /api/v1/agents/{region}`)."""
        return AgentReport(
            region=self.settings.region, agent_id=self.agent_id, sent_at=self.clock.utcnow(),
            snapshot_version=self.snapshot.version if self.snapshot else None,
            snapshot_epoch=self.snapshot.controlplane_epoch if self.snapshot else None,
            instances=[AgentInstance(
                instance_id=i.instance_id, zone=i.zone, version=i.version, url=i.url, origin=i.origin,
                pool_state=i.state.value if i.state else None, verdict=i.verdict.value if i.verdict else None,
                verdict_reason=i.reason[:2000], verdict_since=i.verdict_since, lease_held=i.lease is not None,
                lease_generation=i.lease.generation if i.lease else i.generation if i.origin == "registry" else None,
                canary_verdict=i.canary.verdict.value if i.canary else None, canary_at=i.canary_at,
                canaries=i.canaries) for i in self.instances.values()],
            staging=self.staging.report() if self.staging is not None else None)

    async def send_report(self) -> str:
        """Build and send the report; its outcome is counted (lifeline_agent_reports_total{outcome})."""
        outcome = await self.reporter.send(self.report())
        self.metrics.reports.labels(outcome).inc()
        return outcome

    def status(self) -> dict:
        """What the agent believes, for tests and benches (the control plane shows its report: GET /api/v1/agents)."""
        return {"snapshot_version": self.snapshot.version if self.snapshot else None,
                "instances": {i.instance_id: {"url": i.url, "zone": i.zone, "version": i.version, "origin": i.origin,
                                              "state": i.state.value if i.state else None,
                                              "verdict": i.verdict.value if i.verdict else None, "reason": i.reason,
                                              "generation": i.lease.generation if i.lease else None,
                                              "canaries": i.canaries, "wrong_outputs": i.wrong_outputs,
                                              "stock_vllm": i.stock_vllm, "supported": i.supported,
                                              "unleasable": i.unleasable}
                              for i in self.instances.values()},
                "faults": {"open": {scope: entry.fault.fault_id for scope, entry in self.faults.open.items()},
                           "reported": {fault_id: outcome for fault_id, (outcome, _) in self.fault_outcomes.items()},
                           "unreported": sorted(self._unreported)},
                "canary_rollbacks": {f"{m}:{a}@{r}": outcome for (m, a, r), (outcome, _) in
                                     self.rollback_outcomes.items()}}

    async def close(self) -> None:
        """Release every lease the agent holds (clean shutdown) and stop the pool's processes."""
        for task in (self._fault_task, self._rollback_task):
            if task is not None:
                task.cancel()
        if self.staging is not None:
            self.staging.cancel()
        for instance in self.instances.values():
            for task in (instance.canary_task, instance.metrics_task):
                if task is not None:
                    task.cancel()
            await self.release(instance)
        if self.reconciler.draining:
            await asyncio.gather(*self.reconciler.draining, return_exceptions=True)
        if self.driver is not None:
            await self.driver.close()


def instance_id_from_url(url: str) -> str:
    """An instance id for an engine named only by its URL: the host's first label when it is a name (a
    StatefulSet pod's DNS name begins with the pod's), else `host-port` (an address says nothing more)."""
    parsed = httpx.URL(url)
    host = parsed.host or url
    is_address = host.replace(".", "").isdigit() or ":" in host or host == "localhost"
    if is_address:
        return f"{host.replace(':', '_')}-{parsed.port or (443 if parsed.scheme == 'https' else 80)}"
    return host.split(".")[0]


def _routing_class(verdict: Verdict | None) -> str:
    """What a gateway does with a verdict: the event says whether that changed (routing_tier l7 either way)."""
    if verdict is None or verdict in EJECT:
        return "out"
    return {Verdict.OVERLOADED: "de-weighted", Verdict.DRAINING: "no new sessions",
            Verdict.OLD_GENERATION: "no new sessions"}.get(verdict, "routed")


def _default_agent_id() -> str:
    import os
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"[:160]


def load_canary_file(path) -> dict[str, CanaryRecord]:
    raw = json.loads(path.read_text())
    return {version: CanaryRecord.model_validate(record) for version, record in raw.items()}


async def serve(settings: AgentSettings, *, stop: asyncio.Event | None = None,
                driver: PoolDriver | None = None) -> None:
    """Build the agent from settings and run its loops until `stop` is set (or the process is signalled).

    `driver`: the pool driver already built from `settings.pool` (the CLI builds it first, so a setting
    that cannot work stops start-up naming the key); built here when not given.
    """
    from contract.lease import RedisLeaseRegistry
    from warm_pool.driver import build_driver
    from warm_pool.served import served_recently

    clock = SystemClock()
    timeout = settings.probe_timeout.total_seconds()
    http = httpx.AsyncClient(timeout=httpx.Timeout(connect=min(1.0, timeout), read=timeout, write=timeout, pool=timeout))
    cp_http = httpx.AsyncClient(timeout=httpx.Timeout(2.0))
    registry = RedisLeaseRegistry.from_url(settings.registry, region=settings.region, prefix=settings.registry_prefix,
                                           ttl=settings.lease_ttl)
    snapshots = None
    if settings.controlplane_url:
        snapshots = SnapshotClient(cp_http, settings.controlplane_url, token=settings.controlplane_token,
                                   cache_path=settings.snapshot_cache)
        snapshots.load_cache()
    if driver is None and settings.pool is not None:
        driver = build_driver(settings.region, settings.pool)
    shipper = EventShipper(cp_http, settings.controlplane_url, token=settings.controlplane_token)
    reporter = ReportSender(cp_http, settings.controlplane_url, token=settings.controlplane_token)
    board = RedisVerdictBoard(registry.redis, region=settings.region, prefix=settings.registry_prefix)
    faults = FaultReporter(cp_http, settings.controlplane_url, token=settings.controlplane_token,
                           timeout_s=settings.fault_report_timeout.total_seconds())
    rollbacks = CanaryRollbackReporter(cp_http, settings.controlplane_url, token=settings.controlplane_token)
    agent = Agent(settings, registry=registry, http=http, clock=clock, driver=driver, shipper=shipper,
                  snapshots=snapshots, reporter=reporter, agent_id=settings.agent_id or _default_agent_id(),
                  verdict_board=board, fault_reporter=faults, rollback_reporter=rollbacks,
                  canary_records=load_canary_file(settings.canary_file) if settings.canary_file else {})
    if settings.port:
        from prometheus_client import start_http_server

        start_http_server(settings.port, addr="127.0.0.1", registry=agent.metrics.registry)
    stop = stop or asyncio.Event()

    async def every(seconds: float, work) -> None:
        while not stop.is_set():
            try:
                await work()
            except Exception:
                log.exception("agent loop step failed", step=work.__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), seconds)

    async def poll_snapshot() -> None:
        if snapshots is not None and settings.controlplane_url:
            await snapshots.poll()
            agent.credit_served(await served_recently(cp_http, settings.controlplane_url, region=settings.region,
                                                      token=settings.controlplane_token))

    try:
        await asyncio.gather(every(settings.snapshot_poll_interval.total_seconds(), poll_snapshot),
                             every(settings.probe_interval.total_seconds(), agent.tick),
                             every(0.5, shipper.flush),
                             every(settings.report_interval.total_seconds(), agent.send_report))
    finally:
        await agent.close()
        await shipper.flush()
        await registry.close()
        await http.aclose()
        await cp_http.aclose()


def run_agent(settings: AgentSettings, *, driver: PoolDriver | None = None) -> None:
    import logging
    import signal

    # httpx logs every request at INFO: several probes per instance per second would drown the events
    logging.getLogger("httpx").setLevel(logging.WARNING)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(settings, stop=stop, driver=driver)

    asyncio.run(main())
