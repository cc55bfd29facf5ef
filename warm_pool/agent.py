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
import contextlib
import json
from datetime import datetime

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge

from common.clock import Clock, SystemClock
from common.logs import get_logger
from contract.canary import CanaryRecord
from contract.events import AgentReport
from contract.identity import EngineIdentity
from contract.lease import Lease, LeaseRegistry
from contract.snapshot import RoutingSnapshot
from contract.snapshot_client import SnapshotClient
from contract.verdict import RedisVerdictBoard, VerdictBoard
from warm_pool.agent_reporting import AgentReporting
from warm_pool.budget import ProbeBudget
from warm_pool.canaries import PROBE_RATE_WINDOW_S, Canaries
from warm_pool.canary_rollback import CanaryRollbackReporter
from warm_pool.canary_rollback_reports import CanaryRollbackReports
from warm_pool.driver import PoolDriver
from warm_pool.events import EventShipper
from warm_pool.fault import FaultDetector, FaultReporter, Observation
from warm_pool.fault_reports import FaultReports
from warm_pool.health_probes import HealthProbes
from warm_pool.instance import Instance
from warm_pool.leases import LeaseKeeper
from warm_pool.probe import Prober
from warm_pool.reconciler import PoolReconciler
from warm_pool.report import ReportSender
from warm_pool.settings import AgentSettings, ExternalEngine
from warm_pool.staging import StagingCheck

log = get_logger(__name__)


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
    """The loop and what every step shares: settings, instances, clients, metrics, the canary/release order.

    Each step's work is a collaborator the agent owns (`probes`, `canaries`, `leases`, `fault_reports`,
    `rollback_reports`, `reporting`, `reconciler`); the methods kept here by the old names (`admitted`,
    `register`, `release`, `emit`, `report`, ...) delegate to them for the reconciler, the CLI and tests.
    """

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
        self.lost_this_round: list[Observation] = []  # lost this round: gone, for the fault detector
        self.rollback_reporter = rollback_reporter or CanaryRollbackReporter(None, None)
        pool = settings.pool
        # the cold tier's promise (artifacts staged and verified, not loaded), checked in the background
        self.staging = StagingCheck(pool, region=settings.region, actor=self.actor, clock=self.clock,
                                    emit=lambda event: self.shipper.emit(event), registry=self.metrics.registry) \
            if pool is not None and pool.tier == "cold" else None
        self.probes = HealthProbes(self)  # live / ready / generation, stock vLLM's progress, restarts
        self.canaries = Canaries(self)  # admission and routine canaries, and the verdict they make
        self.leases = LeaseKeeper(self)  # register, renew, release for engines that cannot
        self.fault_reports = FaultReports(self)  # zone and region faults, posted for cutover
        self.rollback_reports = CanaryRollbackReports(self)  # failed non-prod versions, posted to the catalog
        self.reporting = AgentReporting(self)  # events, the verdict board, the report, metrics
        self.reconciler = PoolReconciler(self)  # the warm pool: backfill, promote, rebalance, the version roll

    # -- desired state -------------------------------------------------------------------------------
    @property
    def snapshot(self) -> RoutingSnapshot | None:
        return self.snapshots.current if self.snapshots else None

    def expected_versions(self) -> frozenset[str] | None:
        """The versions the snapshot's aliases point to; None (no generation check) before any snapshot, and while
        the snapshot names no alias at all: an empty catalog says which version is wanted no more than none does,
        and would otherwise judge every engine of the region old_generation."""
        if self.snapshot is None:
            return None
        versions = frozenset(a.version for m in self.snapshot.models.values() for a in m.aliases.values())
        return versions or None

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

    def next_seq(self) -> int:
        """The next mark in the one order canaries and releases share (virtual time may not move between them)."""
        self._seq += 1
        return self._seq

    # -- the loop ------------------------------------------------------------------------------------
    async def tick(self) -> None:
        if not self.reconciler.adopted:
            await self.reconciler.adopt_pool()  # before observe: their leases are the pool's, not engines' own
        await self.observe()
        await self.probes.probe()
        self.canaries.start()
        await self.leases.apply()
        await self.reconciler.reconcile_pool()
        await self.publish_verdicts()
        self.fault_reports.detect()
        self.fault_reports.report()
        self.rollback_reports.report()
        if self.staging is not None:
            self.staging.start(self.snapshot)
        self.reporting.export_metrics()

    async def run_ticks(self, stop: asyncio.Event) -> None:
        """Tick every probe interval until `stop` is set: for tests and benches that drive the agent in their loop.

        Stopped by an event, not by cancelling alone: on Python 3.11 `asyncio.wait_for` (the health probes)
        can swallow a cancellation that lands as its inner call completes, and a loop stopped only by
        `cancel()` then ticks on forever (bench/pool.py hung so). A tick that fails (Redis slow to accept a
        connection on a loaded machine) is logged and the next one runs, as `serve()`'s loop does.
        """
        while not stop.is_set():
            try:
                await self.tick()
            except Exception:
                log.exception("agent loop step failed", step="tick")
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

    # -- what the reconciler, the CLI loops and tests call (each delegates to the collaborator that does it) --
    def admitted(self, instance: Instance) -> bool:
        return self.canaries.admitted(instance)

    async def register(self, instance: Instance) -> None:
        await self.leases.register(instance)

    async def release(self, instance: Instance) -> None:
        await self.leases.release(instance)

    def emit(self, kind: str, instance: Instance, reason: str, **detail: str | int | float | bool | None) -> None:
        self.reporting.emit(kind, instance, reason, **detail)

    def verdicts(self) -> VerdictBoard:
        return self.reporting.verdicts()

    async def publish_verdicts(self) -> None:
        await self.reporting.publish_verdicts()

    def report(self) -> AgentReport:
        return self.reporting.report()

    async def send_report(self) -> str:
        return await self.reporting.send_report()

    def status(self) -> dict:
        return self.reporting.status()

    @property
    def rollback_outcomes(self) -> dict[tuple[str, str, int], tuple[str, object]]:
        return self.rollback_reports.outcomes

    async def close(self) -> None:
        """Release every lease the agent holds (clean shutdown) and stop the pool's processes."""
        for task in (self.fault_reports.task, self.rollback_reports.task):
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

        start_http_server(settings.port, addr=str(settings.metrics_host), registry=agent.metrics.registry)
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
