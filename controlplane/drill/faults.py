"""What each drill fault does to the fleet, what it may touch, how it is undone, and what it alone measures.

    fault              scope     touches (its footprint)                 injected by      undone by
    sigkill            instance  one instance of the blast radius        SIGKILL (fleet)  restart (new generation)
    sigstop            instance  one instance's engine (stock vLLM:      SIGSTOP (fleet)  SIGCONT
                                 its engine core; its API server still
                                 answers /health)
    hang               instance  one instance                            fault admin      faults cleared
    corrupt_weights    instance  one instance                            fault admin      restart
    bad_version        instance  one instance: started again from        the fleet        redeployed from
                                 another version's weights under the     (its             its own version
                                 same name (a rollout of the wrong       `bad_version`
                                 build); measured: the agent's canary    command)
                                 verdict on it (`canary_detection_s`)
    zone_loss          zone      every instance the fleet places in it   SIGKILL each     restart each
    controlplane_down  region    the control-plane API process the       SIGSTOP          SIGCONT
                                 region's gateways poll
    redis_down         region    the region's lease-registry /           SIGSTOP          SIGCONT
                                 token-log Redis
    region_loss        region    every process the fleet places  SIGKILL each     restart each, then
                                 in the region (engines, gateways)                 roll back the dns cutover
                                 refused (`RegionTierNotWired`) without a second region and a dns tier

On stock vLLM (`Fleet.engine_of(i) == "vllm"`) `sigkill`, `sigstop`,
`bad_version` and `zone_loss` work as on the reference engine (the kill takes vLLM's process
group: its engine core too; a restart waits for `/health`; the stop takes
the engine core alone, the wedge vLLM's own health check misses); `hang`,
`corrupt_weights` and a `traffic.token_delay_ms` go through the reference
engine's fault admin, which vLLM does not have, and are refused before
anything is touched (`FaultNotInjectable`, 422 `fault_not_injectable`).

Zone and region losses are cut over by Lifeline on its own (the agent's
fault report → the escalation ladder → the tier's driver); the plan only
watches the tier that should act (`controlplane/drill/tiers.py`: BIRD's
routes for anycast, the DNS server's answer for dns), waits for the
automatic cutover to end, and at rollback returns what it took away first
and then rolls that cutover back. A zone drill watches a tier only where
the fleet wires one (`Fleet.anycast_tier`) and its `expected_tier` is it.

`plan_fault()` computes the footprint from the fleet and checks it against
the blast radius *before anything is touched*: a target outside it, a
footprint that reaches an instance or zone the radius does not name, or one
larger than its cap is refused (`OutsideBlastRadius`). A fleet that cannot
carry the fault out (no pid for the control plane, no Redis handle) is
refused too (`UnsupportedDrill`), never faked.

Why the control-plane drill stops the *API process the gateways poll* and
not the database: the runner lives in the control plane (a Celery worker,
or the CLI) and records the run in that database; taking the database away
would take the drill's own record, its operator abort and its stop
conditions with it. The API process is what the data plane depends on
(snapshot polls, reports, L7 events), so silencing it is the fault
invariant 7 is about. SIGSTOP, not SIGKILL: connections are still accepted
by the kernel and never answered, which is the harder case for a client
(every poll waits out its timeout instead of failing fast), and SIGCONT
undoes it without a restart, so a rollback cannot fail half-way. A fleet
whose control plane is the runner's own process is refused.

Outage faults (`hold_s`) are cleared by the runner after `fault_duration_s`
while traffic still flows; instance and zone faults are undone after the
traffic.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import httpx

from common.clock import Clock
from common.logs import get_logger
from common import oneshot_http
from controlplane.drill.errors import FaultNotInjectable, OutsideBlastRadius, RegionTierNotWired, UnsupportedDrill
from controlplane.drill.measure import RequestTrace
from controlplane.drill.schemas import BlastRadius, Traffic
from controlplane.drill.states import DrillFault, DrillScope
from controlplane.event.dataplane import is_wrong_output_verdict
from controlplane.drill.tiers import CutoverWatch

log = get_logger(__name__)


class ProcessHandle(Protocol):
    """A process a drill may silence: the fleet's control-plane API, or a region's Redis."""

    url: str

    def pause(self) -> None:
        """SIGSTOP: the process stops answering; its sockets stay open."""

    def resume(self) -> None:
        """SIGCONT."""


class PidHandle:
    """A `ProcessHandle` by pid (a pid file, or a child process): SIGSTOP / SIGCONT."""

    def __init__(self, url: str, pid: Callable[[], int], *, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self._pid = pid
        self.token = token

    @property
    def pid(self) -> int:
        return self._pid()

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # gone: nothing left to resume


def gateway_metric(gateway_urls: list[str], name: str) -> float:
    """The sum of one metric sample over every gateway's /metrics (a gateway that does not answer adds nothing)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for url in gateway_urls:
        try:
            text = oneshot_http.get(url.rstrip("/") + "/metrics", timeout=2.0).text
        except httpx.HTTPError:
            continue
        total += sum(sample.value for family in text_string_to_metric_families(text)
                     for sample in family.samples if sample.name == name)
    return total


# -- footprints (pure) ----------------------------------------------------------------------------
def check_blast_radius(radius: BlastRadius, targets: list[str]) -> None:
    """Refuse any target the blast radius does not name, and more targets than its cap."""
    outside = [t for t in targets if not radius.allows_instance(t)]
    if outside:
        raise OutsideBlastRadius(f"fault target(s) {outside} are outside the blast radius {radius.instances}")
    if len(set(targets)) > radius.max_instances:
        raise OutsideBlastRadius(f"{len(set(targets))} targets exceed the blast radius cap of {radius.max_instances}")


def zone_footprint(radius: BlastRadius, zone: str, placement: dict[str, str | None]) -> list[str]:
    """The instances a loss of `zone` kills, refused if any of it lies outside the blast radius.

    `placement` is instance → zone as the fleet knows it. Refused: a zone the
    radius does not name; a zone with nothing in it (nothing to drill); a
    footprint with an instance whose zone is unknown (it might be anywhere);
    one that names instances the radius's own list leaves out (when it has
    one); more instances than the cap.
    """
    if not radius.allows_zone(zone):
        raise OutsideBlastRadius(f"zone {zone!r} is outside the blast radius zones {radius.zones}")
    unplaced = sorted(i for i, z in placement.items() if z is None)
    if unplaced:
        raise OutsideBlastRadius(f"the fleet does not say which zone {unplaced} are in: a zone loss could reach "
                                 "them wherever they are")
    footprint = sorted(i for i, z in placement.items() if z == zone)
    if not footprint:
        raise OutsideBlastRadius(f"no instance of the fleet is in zone {zone!r}: nothing to drill")
    if radius.instances:
        outside = [i for i in footprint if not radius.allows_instance(i)]
        if outside:
            raise OutsideBlastRadius(f"losing zone {zone!r} would kill {outside}, which the blast radius "
                                     f"{radius.instances} does not name")
    if len(footprint) > radius.max_instances:
        raise OutsideBlastRadius(f"losing zone {zone!r} kills {len(footprint)} instances {footprint}, over the "
                                 f"blast radius cap of {radius.max_instances}")
    return footprint


def region_footprint(radius: BlastRadius, region: str, placement: dict[str, str | None],
                     engines: dict[str, str | None]) -> list[str]:
    """Every process a loss of `region` kills, refused if any of it lies outside the blast radius.

    `placement` is process → region for every process the fleet runs
    (engines by instance id, gateways and the rest by name); `engines` is
    instance → zone for the engines among them. Refused: a region the
    radius does not name; a process whose region is unknown (it might be
    in it); an engine the radius's `instances` list leaves out (when it
    has one); a zone of the region its `zones` list leaves out (when it has
    one: a region's loss takes every zone of it); more engines than the
    cap; a region with nothing in it.
    """
    if region != radius.region:
        raise OutsideBlastRadius(f"region {region!r} is outside the blast radius region {radius.region!r}")
    unplaced = sorted(name for name, where in placement.items() if where is None)
    if unplaced:
        raise OutsideBlastRadius(f"the fleet does not say which region {unplaced} are in: a region loss could "
                                 "reach them wherever they are")
    footprint = sorted(name for name, where in placement.items() if where == region)
    killed_engines = [name for name in footprint if name in engines]
    if not killed_engines:
        raise OutsideBlastRadius(f"no engine of the fleet is in region {region!r}: nothing to drill")
    if radius.instances:
        outside = [i for i in killed_engines if not radius.allows_instance(i)]
        if outside:
            raise OutsideBlastRadius(f"losing region {region!r} would kill {outside}, which the blast radius "
                                     f"{radius.instances} does not name")
    if radius.zones:
        zones = sorted({z for i in killed_engines if (z := engines[i]) is not None and not radius.allows_zone(z)})
        if zones:
            raise OutsideBlastRadius(f"losing region {region!r} takes zone(s) {zones} too, which the blast radius "
                                     f"zones {radius.zones} do not name")
    if len(killed_engines) > radius.max_instances:
        raise OutsideBlastRadius(f"losing region {region!r} kills {len(killed_engines)} engines {killed_engines}, "
                                 f"over the blast radius cap of {radius.max_instances}")
    return footprint


# -- the plan a run carries out -------------------------------------------------------------------------
@dataclass
class FaultPlan:
    """One fault, its footprint, and how to inject, clear and measure it. Subclasses per kind of fault."""

    fault: DrillFault
    target: str  # recorded as the run's fault_target
    instances: list[str] = field(default_factory=list)  # instances it faults (killed, hung, corrupted)
    prefer: list[str] = field(default_factory=list)  # traffic pinned to these, round robin (streams in flight there)
    hold_s: float | None = None  # outage faults: cleared this long after injection while traffic flows
    keep_traffic: bool = False  # traffic continues until the fault is cleared
    slow: list[str] | None = None  # where traffic.token_delay_ms applies (None: `prefer`, which clear() restores)
    expects_tier: bool = True  # a routing tier is expected to act (outage faults: the data plane rides it out)
    injected: bool = False

    def inject(self) -> None:
        raise NotImplementedError

    def clear(self) -> None:
        """Undo the fault; safe to call more than once and when it never landed."""
        raise NotImplementedError

    def tick(self, now: float) -> None:
        """Called every loop while the fault is on (observations an outage drill makes)."""

    def after_clear(self) -> None:
        """Called once the fault is cleared and the traffic has ended (waiting for reconciliation)."""

    def documented_refusal(self, trace: RequestTrace) -> bool:
        """An error the docs promise for this fault (not a lost request)."""
        return False

    def measurements(self, fault_at: float, cleared_at: float | None) -> dict[str, float | None]:
        """Extra figures this fault alone measures, each from this run."""
        return {}

    def targets(self) -> dict[str, float]:
        """Bounds on this fault's own figures that the docs promise (each becomes a verdict)."""
        return {}

    def checks(self) -> list[str]:
        """Promises this fault's docs make that are not figures; each one broken is a follow-up item."""
        return []

    def details(self) -> dict[str, Any]:
        """What the report says beyond the figures (per-gateway observations)."""
        return {}


class _Engines:
    """The engine fault admin (`--enable-fault-admin`) and the fleet's kill/restart.

    Shared by instance and zone faults.
    """

    def __init__(self, fleet: Any) -> None:
        self.fleet = fleet

    def admin(self, instance_id: str, faults: dict[str, Any]) -> None:
        """POST the engine's fault admin: the whole fault set is replaced by `faults`."""
        oneshot_http.post(self.fleet.engine_url(instance_id) + "/admin/faults", json=faults, timeout=5.0).raise_for_status()

    def tokens_sent(self, instance_id: str) -> int:
        current = oneshot_http.get(self.fleet.engine_url(instance_id) + "/admin/faults", timeout=5.0)
        return int(current.raise_for_status().json().get("tokens_sent", 0))


@dataclass
class InstanceFault(FaultPlan):
    engines: _Engines | None = None

    def inject(self) -> None:
        assert self.engines is not None
        victim = self.instances[0]
        log.warning("drill_fault_injected", instance=victim, fault=self.fault.value)
        self.injected = True
        if self.fault == DrillFault.SIGKILL:
            self.engines.fleet.kill(victim)
        elif self.fault == DrillFault.SIGSTOP:
            self.engines.fleet.stop(victim)
        elif self.fault == DrillFault.HANG:
            self.engines.admin(victim, {"hang_after_tokens": self.engines.tokens_sent(victim)})
        else:
            self.engines.admin(victim, {"corrupt_weights": True})

    def clear(self) -> None:
        """Faults cleared; a stopped engine continued; a killed or corrupted process restarted (a new generation)."""
        assert self.engines is not None
        victim = self.instances[0]
        if self.fault == DrillFault.SIGSTOP:
            self.engines.fleet.resume(victim)  # SIGCONT: a no-op on a process that runs
            return
        if self.fault == DrillFault.HANG:
            try:
                self.engines.admin(victim, {})
                return
            except httpx.HTTPError as error:
                log.warning("drill_rollback_clear_failed", instance=victim, error=repr(error))
        self.engines.fleet.restart(victim)


@dataclass
class BadVersion(FaultPlan):
    """The instance started again from another version's weights, under the same name and address.

    Nothing on the request path can tell: the engine is healthy, ready and
    fast. Only the agent's canary (the catalog's recorded token ids for the
    version the alias names) can, by refusing or dropping the lease. The
    fault is stamped once the wrong build answers (`Fleet.deploy_bad_version`
    returned); traffic keeps flowing for `hold_s` (`traffic.fault_duration_s`)
    so the canary is measured under load; the verdict is read back from the
    control plane's event log (`canary_detection_s`: the fault → the agent's
    `wrong_output` verdict naming the instance, stamped by the agent).
    Answers that differ from the undisturbed run are the runner's
    `wrong_answers`. A run whose canary never judged the instance is a
    follow-up item, never a pass. Undone by redeploying its own version.
    """

    fleet: Any = None
    events: Any = None  # the runner's EventReader (None: the verdict cannot be read back, so unverified)
    clock: Clock | None = None
    sleep: Callable[[float], None] | None = None
    verdict_wait_s: float = 30.0  # the agent ships its events in batches: how long after the hold to wait
    first_event: int = 0  # the log's last event before the drill; then the last one read (each is read once)
    deployed_wall: float | None = None
    verdict: dict[str, Any] | None = None
    _next_look: float = 0.0

    def prepare(self) -> None:
        if self.events is not None:
            self.first_event = self.events.last_id()

    def inject(self) -> None:
        assert self.clock is not None
        log.warning("drill_fault_injected", instance=self.target, fault=self.fault.value)
        self.injected = True
        self.fleet.deploy_bad_version(self.target)
        self.deployed_wall = self.clock.wall()

    def _look(self) -> None:
        if self.events is None or self.verdict is not None:
            return
        try:
            rows = self.events.events_after(self.first_event)
        except httpx.HTTPError:
            return
        self.first_event = max([self.first_event, *(e["id"] for e in rows)])
        self.verdict = next((e for e in rows if is_wrong_output_verdict(e, self.target)), None)

    def tick(self, now: float) -> None:
        if now >= self._next_look:
            self._next_look = now + 0.5
            self._look()

    def clear(self) -> None:
        if self.injected:
            self.fleet.redeploy(self.target)

    def after_clear(self) -> None:
        assert self.clock is not None and self.sleep is not None
        deadline = self.clock.now() + self.verdict_wait_s
        self._look()
        while self.injected and self.verdict is None and self.events is not None and self.clock.now() < deadline:
            self.sleep(0.5)
            self._look()

    def _verdict_s(self) -> float | None:
        if self.verdict is None or self.deployed_wall is None:
            return None
        # The fleet sees the wrong build ready by polling it (0.2 s); an agent that judged it between that
        # poll's answer and its return was no slower than at once.
        return max(0.0, datetime.fromisoformat(self.verdict["started_at"]).timestamp() - self.deployed_wall)

    def measurements(self, fault_at: float, cleared_at: float | None) -> dict[str, float | None]:
        return {"canary_detection_s": self._verdict_s()}

    def checks(self) -> list[str]:
        if not self.injected:
            return []
        if self.events is None:
            return [f"no event log wired: the canary's verdict on {self.target} could not be read back"]
        if self.verdict is None:
            return [f"the agent's canary never judged {self.target} wrong_output while it served another "
                    "version's weights under the model's name"]
        return []

    def details(self) -> dict[str, Any]:
        return {"instance": self.target, "verdict": None if self.verdict is None else {
            k: self.verdict.get(k) for k in ("id", "actor", "reason", "started_at")}}


@dataclass
class ZoneLoss(FaultPlan):
    """Every engine of one zone SIGKILLed at once (the fleet's / pool driver's kill); each restarted on rollback."""

    engines: _Engines | None = None
    killed: list[str] = field(default_factory=list)
    watch: CutoverWatch | None = None  # the anycast tier, where the fleet wires it and the drill expects it

    def prepare(self) -> None:
        if self.watch is not None:
            self.watch.prepare()

    def inject(self) -> None:
        assert self.engines is not None
        log.warning("drill_fault_injected", zone=self.target, instances=self.instances, fault=self.fault.value)
        self.injected = True
        for instance in self.instances:
            self.engines.fleet.kill(instance)
            self.killed.append(instance)

    def tick(self, now: float) -> None:
        if self.watch is not None:
            self.watch.tick(now)

    def clear(self) -> None:
        assert self.engines is not None
        if self.watch is not None and self.injected and not self.watch.found:
            self.watch.wait_for_cutover()  # Lifeline's own cutover first: then the zone is returned
        # Every instance of the footprint, killed or not: one the drill slowed is put back clean by its restart.
        for instance in self.instances:
            self.engines.fleet.restart(instance)
        if self.watch is not None and self.injected and self.watch.return_started_at is None:
            self.watch.roll_back(f"drill: zone {self.target} returned")

    def measurements(self, fault_at: float, cleared_at: float | None) -> dict[str, float | None]:
        return self.watch.measurements(fault_at, "route_withdrawn") if self.watch is not None else {}

    def checks(self) -> list[str]:
        return self.watch.checks(injected=self.injected) if self.watch is not None else []

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {"zone": self.target, "instances_killed": list(self.killed)}
        if self.watch is not None:
            out["cutover"] = self.watch.details()
        return out


@dataclass
class RegionLoss(FaultPlan):
    """Every process of one region SIGKILLed at once; Lifeline moves the region's DNS record on its own.

    Traffic keeps flowing for `hold_s` (`traffic.fault_duration_s`), the
    clients re-resolving the name through the DNS server on every attempt
    (`Fleet.resolve_gateway`) and retrying a broken request from scratch
    (`traffic.retry_for_s`). At the end of the hold the region is returned:
    its processes restarted (`Fleet.restore_region`), then the automatic dns
    cutover rolled back and the record seen back at the DNS server. The
    processes outside the footprint are listed with their pids before the
    fault and checked after: one that changed is a follow-up item (the
    drill reached outside its blast radius).
    """

    fleet: Any = None
    region: str = ""
    watch: CutoverWatch | None = None
    killed: dict[str, int | None] = field(default_factory=dict)
    outside_before: dict[str, int | None] = field(default_factory=dict)
    outside_after: dict[str, int | None] = field(default_factory=dict)
    restored_s: float | None = None
    clock: Clock | None = None

    def prepare(self) -> None:
        assert self.watch is not None
        self.watch.prepare()
        if self.watch.out_before:
            raise UnsupportedDrill(f"the dns tier already routes {self.region} away (its record does not name it): "
                                   "a region-loss drill would measure nothing")
        self.outside_before = self._outside()

    def _outside(self) -> dict[str, int | None]:
        return {name: pid for name, (_, pid) in self.fleet.all_processes().items() if name not in self.instances}

    def inject(self) -> None:
        log.warning("drill_fault_injected", region=self.region, processes=self.instances, fault=self.fault.value)
        self.injected = True
        pids = self.fleet.all_processes()
        for name in self.instances:
            self.killed[name] = pids.get(name, (None, None))[1]
            self.fleet.kill_process(name)

    def tick(self, now: float) -> None:
        assert self.watch is not None
        self.watch.tick(now)

    def clear(self) -> None:
        assert self.watch is not None and self.clock is not None
        if self.injected and not self.watch.found:
            self.watch.wait_for_cutover()
        started = self.clock.now()
        self.fleet.restore_region(self.region)  # the region's processes first, then its record
        self.restored_s = self.clock.now() - started
        if self.injected and self.watch.return_started_at is None:
            self.watch.roll_back(f"drill: region {self.region} returned")
            self.watch.sweep_inside(f"drill: region {self.region} returned")
        self.outside_after = self._outside()

    def measurements(self, fault_at: float, cleared_at: float | None) -> dict[str, float | None]:
        assert self.watch is not None
        return {**self.watch.measurements(fault_at, "dns_moved"), "region_restored_s": self.restored_s}

    def checks(self) -> list[str]:
        assert self.watch is not None
        out = self.watch.checks(injected=self.injected)
        touched = sorted(n for n, pid in self.outside_before.items() if self.outside_after.get(n) != pid)
        if self.injected and touched:
            out.append(f"processes outside the blast radius changed during the drill: {touched}")
        return out

    def details(self) -> dict[str, Any]:
        assert self.watch is not None
        return {"region": self.region, "processes_killed": dict(self.killed),
                "outside_untouched": {n: self.outside_after.get(n) == pid for n, pid in self.outside_before.items()},
                "cutover": self.watch.details()}


@dataclass
class ControlPlaneDown(FaultPlan):
    """The control-plane API the region's gateways poll stops answering (SIGSTOP) for `hold_s`.

    Measures invariant 7 from the control plane's own records: before the
    fault, each gateway's report (`GET /api/v1/gateways`: snapshot version,
    epoch and when it was applied; fresh reports only, so a replica long
    gone is not waited for); after SIGCONT, the first report each gateway
    built after the return that names the snapshot the control plane
    serves now. From those: how long each gateway ran on
    its last good snapshot (fault → reconciled), how long it took to
    reconcile once the control plane answered again (the first report the
    gateway built after the return that names the snapshot served now: its
    poll got that snapshot or a 304 for it), and whether the
    snapshot it served through the outage is the one it had applied before
    (same version, epoch and applied_at). Traffic continues through the
    outage; requests lost must be 0.
    """

    controlplane: Any = None
    gateway_urls: list[str] = field(default_factory=list)
    clock: Clock | None = None
    sleep: Callable[[float], None] | None = None
    reconcile_timeout: float = 60.0
    before: dict[str, dict[str, Any]] = field(default_factory=dict)
    after: dict[str, dict[str, Any]] = field(default_factory=dict)
    reconciled_at: dict[str, float] = field(default_factory=dict)
    not_ready_during: int = 0
    ready_probes: int = 0
    fault_wall: float | None = None
    cleared_wall: float | None = None
    cleared_mono: float | None = None
    _next_probe: float = 0.0

    def _api(self, path: str) -> Any:
        response = oneshot_http.get(self.controlplane.url + "/api/v1" + path, timeout=5.0,
                                    headers={"Authorization": f"Bearer {self.controlplane.token}"})
        response.raise_for_status()
        return response.json()

    def _reports(self) -> dict[str, dict[str, Any]]:
        return {r["replica_id"]: r for r in self._api("/gateways")}

    def prepare(self) -> None:
        try:
            reports = self._reports()
        except httpx.HTTPError as error:
            raise UnsupportedDrill(f"the fleet's control plane {self.controlplane.url} does not answer before the "
                                   f"drill ({type(error).__name__}): nothing to take away, nothing to measure "
                                   "against") from None
        self.before = {r: report for r, report in reports.items()
                       if not report.get("stale") and not report.get("foreign_epoch")}
        if not self.before:
            raise UnsupportedDrill("no gateway reports to the fleet's control plane (none fresh): nothing would "
                                   "measure invariant 7 (gateways routing by its snapshot report there)")

    def inject(self) -> None:
        assert self.clock is not None
        log.warning("drill_fault_injected", fault=self.fault.value, controlplane=self.controlplane.url)
        self.fault_wall = self.clock.wall()
        self.injected = True
        self.controlplane.pause()

    def tick(self, now: float) -> None:
        if now < self._next_probe:
            return
        self._next_probe = now + 0.5
        for url in self.gateway_urls:  # the data plane must stay ready on its own while the control plane is silent
            self.ready_probes += 1
            try:
                ok = oneshot_http.get(url.rstrip("/") + "/healthz/ready", timeout=2.0).status_code == 200
            except httpx.HTTPError:
                ok = False
            self.not_ready_during += 0 if ok else 1

    def clear(self) -> None:
        if self.injected and self.cleared_wall is None:
            assert self.clock is not None
            self.controlplane.resume()
            self.cleared_wall, self.cleared_mono = self.clock.wall(), self.clock.now()
            log.info("drill_fault_cleared", fault=self.fault.value, controlplane=self.controlplane.url)
        elif not self.injected:
            self.controlplane.resume()  # harmless on a running process; certain on a stopped one

    def after_clear(self) -> None:
        """Until every gateway reports, after the return, the snapshot the control plane serves now."""
        assert self.clock is not None and self.sleep is not None
        if self.cleared_wall is None:
            return
        deadline = self.clock.now() + self.reconcile_timeout
        current: tuple[Any, Any] | None = None
        while self.clock.now() < deadline and len(self.reconciled_at) < len(self.before):
            try:
                snapshot = self._api("/snapshot")
                current = (snapshot["version"], snapshot.get("controlplane_epoch"))
                reports = self._reports()
            except httpx.HTTPError:
                self.sleep(0.2)
                continue
            for replica, report in reports.items():
                if replica not in self.before or replica in self.reconciled_at:
                    continue
                # Built by the gateway after the return (a report queued during the outage says nothing new).
                reported = datetime.fromisoformat(report["reported_at"]).timestamp()
                if reported > self.cleared_wall and (report.get("snapshot_version"), report.get("snapshot_epoch")) \
                        == current:
                    self.reconciled_at[replica] = self.clock.now() - (self.clock.wall() - reported)
                    self.after[replica] = report
            self.sleep(0.2)

    def measurements(self, fault_at: float, cleared_at: float | None) -> dict[str, float | None]:
        ran = [at - fault_at for at in self.reconciled_at.values()]
        reconcile = [at - cleared_at for at in self.reconciled_at.values()] if cleared_at is not None else []
        complete = len(self.reconciled_at) == len(self.before)
        return {
            "controlplane_down_s": (cleared_at - fault_at) if cleared_at is not None else None,
            "last_good_snapshot_s": max(ran) if ran and complete else None,
            "reconcile_s": max(reconcile) if reconcile and complete else None,
            "gateways_not_ready": float(self.not_ready_during),
            "gateways_changed_snapshot": float(sum(1 for r in self.before if not self._kept(r))),
        }

    def targets(self) -> dict[str, float]:
        return {"gateways_not_ready": 0.0, "gateways_changed_snapshot": 0.0}

    def checks(self) -> list[str]:
        missing = sorted(set(self.before) - set(self.reconciled_at))
        if self.injected and missing:
            return [f"gateways {missing} never reported the current snapshot after the control plane returned "
                    f"(within {self.reconcile_timeout:.0f} s)"]
        return []

    def _kept(self, replica: str) -> bool:
        """The gateway served through the outage on the snapshot it had applied before it (nothing else applied)."""
        before, after = self.before.get(replica) or {}, self.after.get(replica)
        if after is None:
            return False
        keys = ("snapshot_version", "snapshot_epoch", "snapshot_applied_at")
        return all(before.get(k) == after.get(k) for k in keys)

    def details(self) -> dict[str, Any]:
        out = {}
        for replica, before in sorted(self.before.items()):
            after = self.after.get(replica) or {}
            out[replica] = {"snapshot_version_before": before.get("snapshot_version"),
                            "snapshot_applied_at": before.get("snapshot_applied_at"),
                            "snapshot_version_after": after.get("snapshot_version"),
                            "kept_last_good_snapshot": self._kept(replica),
                            "reconciled": replica in self.reconciled_at}
        return {"gateways": out, "ready_probes": self.ready_probes}


@dataclass
class RedisDown(FaultPlan):
    """The region's lease-registry / token-log Redis stops answering (SIGSTOP) for `hold_s`.

    Measures what docs/gateway.md ("When Redis is away") promises, and
    nothing more: streams in flight continue (lost 0, token-identical); the
    lease view fails static (`/healthz/ready` `lease_view.mode`); the token
    log holds frames in the gateway (`lifeline_gateway_token_log_buffered_frames`)
    and flushes them when Redis answers (`…_flushed_frames_total`); a new
    stream during the outage is refused with 503 `token_log_unavailable`
    (one probe, sent by the drill a fifth of the way in); and how long
    after the return every gateway's stores answer again.
    """

    redis: Any = None
    gateway_urls: list[str] = field(default_factory=list)
    clock: Clock | None = None
    sleep: Callable[[float], None] | None = None
    probe: Callable[[], str | None] | None = None  # one new stream; its error type, or None if it was served
    recover_timeout: float = 60.0
    modes_seen: set[str] = field(default_factory=set)
    token_log_down_seen: bool = False
    frames_held_max: float = 0.0
    flushed_before: float = 0.0
    flushed_after: float = 0.0
    probe_error: str | None = "not sent"
    recovered_at: float | None = None
    fault_mono: float | None = None
    probe_sent_at: float | None = None
    probe_answered_at: float | None = None
    _cleared: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def documented_refusal(self, trace: RequestTrace) -> bool:
        return bool(trace.error and "token_log_unavailable" in trace.error)

    def _metric(self, name: str) -> float:
        return gateway_metric(self.gateway_urls, name)

    def prepare(self) -> None:
        self.flushed_before = self._metric("lifeline_gateway_token_log_flushed_frames_total")

    def inject(self) -> None:
        assert self.clock is not None
        log.warning("drill_fault_injected", fault=self.fault.value, redis=self.redis.url)
        self.injected = True
        self.fault_mono = self.clock.now()
        self.redis.pause()
        self._threads = [threading.Thread(target=self._watch, name="drill-redis-watch", daemon=True)]
        if self.probe is not None and self.hold_s is not None:
            self._threads.append(threading.Thread(target=self._send_probe, name="drill-redis-probe", daemon=True))
        for thread in self._threads:
            thread.start()

    def _observe(self) -> tuple[bool, set[str]]:
        """(every gateway ready with its token log answering, lease-view modes seen now)."""
        all_back, modes = True, set()
        for url in self.gateway_urls:
            try:
                body = oneshot_http.get(url.rstrip("/") + "/healthz/ready", timeout=2.0).json()
            except (httpx.HTTPError, ValueError):
                all_back = False
                continue
            mode = (body.get("lease_view") or {}).get("mode")
            if mode:
                modes.add(mode)
            token_log = ((body.get("redis") or {}).get("token_log") or {})
            if token_log.get("available") is False:
                self.token_log_down_seen = True
            all_back = all_back and body.get("status") == "ready" and mode in (None, "fresh") \
                and token_log.get("available", True) is not False
        return all_back, modes

    def _watch(self) -> None:
        """Its own thread while Redis is silent: `/healthz/ready` waits out a socket timeout there, and the
        runner's loop (stop conditions, the hold) must not wait with it."""
        while not self._cleared.is_set():
            _, modes = self._observe()
            self.modes_seen |= modes
            self.frames_held_max = max(self.frames_held_max,
                                       self._metric("lifeline_gateway_token_log_buffered_frames"))
            self._cleared.wait(0.25)

    def _send_probe(self) -> None:
        """One new stream early in the outage; what it got, and when, is the measurement.

        Early (a fifth of the way in) because the gateway's create waits out its
        Redis socket timeout (1 s) before refusing: sent later, a Redis that
        came back within that second would answer it. The report says when it
        was sent and answered, so a probe answered after the return is visible.
        """
        assert self.probe is not None and self.hold_s is not None and self.clock is not None
        if self._cleared.wait(self.hold_s / 5):
            self.probe_error = "not sent: the outage ended first"
            return
        self.probe_sent_at = self.clock.now()
        self.probe_error = self.probe()
        self.probe_answered_at = self.clock.now()

    def clear(self) -> None:
        self.redis.resume()  # harmless on a running process
        self._cleared.set()

    def after_clear(self) -> None:
        assert self.clock is not None and self.sleep is not None
        for thread in self._threads:
            thread.join(timeout=30)
        if not self.injected:
            return
        deadline = self.clock.now() + self.recover_timeout
        while self.clock.now() < deadline:
            back, _ = self._observe()
            if back:
                self.recovered_at = self.clock.now()
                break
            self.sleep(0.1)
        self.flushed_after = self._metric("lifeline_gateway_token_log_flushed_frames_total")

    def measurements(self, fault_at: float, cleared_at: float | None) -> dict[str, float | None]:
        return {
            "redis_down_s": (cleared_at - fault_at) if cleared_at is not None else None,
            "stores_back_s": (self.recovered_at - cleared_at)
            if self.recovered_at is not None and cleared_at is not None else None,
            "frames_held_max": self.frames_held_max,
            "frames_flushed": self.flushed_after - self.flushed_before,
        }

    def checks(self) -> list[str]:
        if not self.injected:
            return []
        out = []
        if self.recovered_at is None:
            out.append(f"the gateways' stores did not answer again within {self.recover_timeout:.0f} s "
                       "of Redis's return")
        if self.probe_error is not None and "token_log_unavailable" not in self.probe_error:
            out.append(f"a new stream during the outage ended '{self.probe_error}', not the documented 503 "
                       "token_log_unavailable (nor served)")
        return out

    def details(self) -> dict[str, Any]:
        def since_fault(at: float | None) -> float | None:
            return None if at is None or self.fault_mono is None else round(at - self.fault_mono, 4)

        return {"lease_view_modes_seen": sorted(self.modes_seen),
                "token_log_unavailable_seen": self.token_log_down_seen,
                "new_stream_during_outage": self.probe_error or "served",
                "new_stream_sent_at_s": since_fault(self.probe_sent_at),
                "new_stream_answered_at_s": since_fault(self.probe_answered_at)}


# -- choosing the plan ------------------------------------------------------------------------------------
# Faults injected through the reference engine's fault admin (`--enable-fault-admin`, POST /admin/faults).
NEEDS_FAULT_ADMIN = {DrillFault.HANG: "a decode hang (hang_after_tokens)",
                     DrillFault.CORRUPT_WEIGHTS: "in-memory weight corruption (corrupt_weights)"}


def refuse_without_hooks(fleet: Any, plan: FaultPlan, traffic: Traffic) -> None:
    """FaultNotInjectable for what the plan would ask of the fault admin of an engine that has none (stock
    vLLM): a fault it injects there, or the token delay that paces the traffic it slows."""
    engine_of = getattr(fleet, "engine_of", None)

    def vllm(instances: list[str]) -> list[str]:
        return [i for i in instances if engine_of is not None and engine_of(i) == "vllm"]

    if isinstance(plan, InstanceFault) and plan.fault in NEEDS_FAULT_ADMIN and (victims := vllm(plan.instances)):
        raise FaultNotInjectable(
            f"instance {victims[0]} is stock vLLM: {NEEDS_FAULT_ADMIN[plan.fault]} is injected through the "
            "reference engine's fault admin (POST /admin/faults), which vLLM does not have; drill it with sigkill, "
            "sigstop or bad_version (or zone_loss), or point the drill at a reference engine")
    slowed = vllm(plan.slow if plan.slow is not None else plan.prefer)
    if traffic.token_delay_ms and slowed:
        raise FaultNotInjectable(
            f"traffic.token_delay_ms={traffic.token_delay_ms:g} slows {slowed} through the reference engine's "
            "fault admin, which stock vLLM does not have: set it to 0 and give the streams enough max_tokens for "
            "the fault to land mid-stream")


def plan_fault(*, scope: DrillScope, fault: DrillFault, radius: BlastRadius, traffic: Traffic, fleet: Any,
               target: str | None, clock: Clock, sleep: Callable[[float], None],
               probe: Callable[[], str | None] | None = None, expected_tier: str = "l7",
               events: Any = None) -> FaultPlan:
    """The plan for this fault on this fleet; refused (nothing touched) if it cannot stay inside `radius` or
    needs a hook the fleet's engines do not have. `events` is the runner's event-log reader (bad_version
    reads the agent's verdict back from it)."""
    plan = _choose_plan(scope=scope, fault=fault, radius=radius, traffic=traffic, fleet=fleet, target=target,
                        clock=clock, sleep=sleep, probe=probe, expected_tier=expected_tier, events=events)
    refuse_without_hooks(fleet, plan, traffic)
    return plan


def _choose_plan(*, scope: DrillScope, fault: DrillFault, radius: BlastRadius, traffic: Traffic, fleet: Any,
                 target: str | None, clock: Clock, sleep: Callable[[float], None],
                 probe: Callable[[], str | None] | None, expected_tier: str, events: Any = None) -> FaultPlan:
    # A fleet that does not name its region (fleet files written before `region:`) is taken to be the radius's.
    fleet_region = getattr(fleet, "region", None) or radius.region
    if radius.region != fleet_region:
        raise OutsideBlastRadius(f"the fleet serves region {fleet_region!r}; the blast radius is region "
                                 f"{radius.region!r}")
    engines = _Engines(fleet)
    if scope == DrillScope.INSTANCE:
        victim = target or next((i for i in radius.instances if i in fleet.instance_ids()), None)
        if victim is None:
            raise OutsideBlastRadius(f"no instance of the blast radius {radius.instances} is in the fleet")
        check_blast_radius(radius, [victim])
        if fault == DrillFault.SIGSTOP and not callable(getattr(fleet, "stop", None)):
            raise UnsupportedDrill("the fleet cannot stop and continue an engine (no `stop`/`resume`): a sigstop "
                                   "drill has no way to inject or undo its fault")
        if fault == DrillFault.BAD_VERSION:
            can = getattr(fleet, "can_deploy_bad_version", None)
            if can is None or not can(victim):
                raise UnsupportedDrill(f"the fleet cannot start {victim} from another version's weights (no "
                                       "`bad_version` command for it): a bad_version drill has no way to inject "
                                       "its fault")
            return BadVersion(fault=fault, target=victim, instances=[victim], prefer=[victim],
                              hold_s=traffic.fault_duration_s, keep_traffic=True, fleet=fleet, events=events,
                              clock=clock, sleep=sleep)
        return InstanceFault(fault=fault, target=victim, instances=[victim], prefer=[victim], engines=engines)
    if fault == DrillFault.ZONE_LOSS:
        zone_of = getattr(fleet, "zone_of", None)
        if zone_of is None:
            raise UnsupportedDrill("the fleet does not say which zone each instance is in; a zone loss cannot be "
                                   "kept inside its blast radius")
        zone = target or radius.zones[0]
        footprint = zone_footprint(radius, zone, {i: zone_of(i) for i in fleet.instance_ids()})
        anycast = getattr(fleet, "anycast_tier", None)
        watch = None
        if expected_tier == "anycast":
            if anycast is None:
                raise UnsupportedDrill("the drill expects the anycast tier to act, and the fleet wires no "
                                       "anycast tier whose routes it could read back")
            watch = CutoverWatch(scope=f"region:{fleet_region}/zone:{zone}", observer=anycast.observer(zone),
                                 cutovers=fleet.cutovers, clock=clock, sleep=sleep)
        return ZoneLoss(fault=fault, target=zone, instances=footprint, prefer=footprint, engines=engines,
                        watch=watch)
    if fault == DrillFault.REGION_LOSS:
        regions = list(getattr(fleet, "regions", lambda: [fleet_region])())
        dns = getattr(fleet, "dns_tier", None)
        if len(regions) < 2 or dns is None:
            raise RegionTierNotWired(
                f"a region-loss drill moves traffic to a standby region through the dns (or anycast) tier; this "
                f"fleet has region(s) {regions} and {'a' if dns else 'no'} dns tier wired, so there is nowhere to "
                "fail over to and nothing would act")
        if expected_tier != "dns":
            raise UnsupportedDrill(f"a region loss is cut over at the dns tier (cutover/escalation.py); a drill "
                                   f"expecting {expected_tier} would wait for a tier that never acts")
        if target is not None and target != fleet_region:
            raise OutsideBlastRadius(f"target {target!r}: this fleet's drilled region is {fleet_region!r}")
        processes = fleet.all_processes()
        footprint = region_footprint(radius, fleet_region, {n: where for n, (where, _) in processes.items()},
                                     {i: fleet.zone_of(i) for i in fleet.instance_ids()})
        watch = CutoverWatch(scope=f"region:{fleet_region}", observer=dns.observer(fleet_region),
                             cutovers=fleet.cutovers, clock=clock, sleep=sleep)
        engines_killed = [n for n in footprint if n in set(fleet.instance_ids())]
        return RegionLoss(fault=fault, target=fleet_region, instances=footprint, slow=engines_killed,
                          hold_s=traffic.fault_duration_s, keep_traffic=True, fleet=fleet, region=fleet_region,
                          watch=watch, clock=clock)
    if target is not None and target != fleet_region:
        raise OutsideBlastRadius(f"target {target!r}: a {fault} drill acts on the region {fleet_region!r} only")
    hold = traffic.fault_duration_s
    if fault == DrillFault.CONTROLPLANE_DOWN:
        controlplane = getattr(fleet, "controlplane", None)
        if controlplane is None:
            raise UnsupportedDrill("the fleet names no control-plane process its gateways poll; "
                                   "a controlplane_down drill has nothing it may stop")
        if getattr(controlplane, "pid", None) == os.getpid():
            raise UnsupportedDrill("the fleet's control plane is the drill runner's own process: stopping it "
                                   "would stop the drill, its record and its abort")
        return ControlPlaneDown(fault=fault, target=f"controlplane:{fleet_region}", hold_s=hold, keep_traffic=True,
                                slow=[], expects_tier=False,
                                controlplane=controlplane, gateway_urls=_gateway_urls(fleet), clock=clock,
                                sleep=sleep)
    if fault == DrillFault.REDIS_DOWN:
        redis = getattr(fleet, "redis", None)
        if redis is None:
            raise UnsupportedDrill("the fleet names no Redis for its lease registry / token log; a redis_down "
                                   "drill has nothing it may stop")
        if scope == DrillScope.ZONE:
            raise OutsideBlastRadius("the region's Redis serves every zone of it: a zone-scoped redis_down drill "
                                     "would reach zones outside its blast radius")
        return RedisDown(fault=fault, target=f"redis:{fleet_region}", hold_s=hold, redis=redis,
                         slow=list(fleet.instance_ids()), expects_tier=False,
                         gateway_urls=_gateway_urls(fleet), clock=clock, sleep=sleep, probe=probe)
    raise UnsupportedDrill(f"no runner for a {scope} drill with fault {fault}")


def _gateway_urls(fleet: Any) -> list[str]:
    return list(getattr(fleet, "gateway_urls", None) or [fleet.gateway_url])
