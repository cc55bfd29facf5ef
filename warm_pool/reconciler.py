"""The pool reconciler: keeps a region's pool at the plan's serving and warm counts per zone, on the agent's loop.

Moved out of warm_pool/agent.py unchanged; the agent owns it and calls it
each tick (`adopt_pool` once, then `reconcile_pool` after leases are
applied). Per reconcile:

    observe     the driver re-reads its instances (`refresh`)
    lose        an instance whose process exited, that did not load in time, failed its admission
                canary, or was ejected (wrong_output, or WARM_FAILURES_TO_REPLACE failed probes) is
                stopped (`pool.lost`); a serving one ejected otherwise is demoted to warm (`pool.demoted`)
    promote     serving short of the plan leases a warm instance (`pool.promoted`, l7), preferring the
                short zone's
    rebalance   one move a tick: a short zone takes its own warm instance back, the lender's extra is
                retired (`pool.stopped`) and backfilled
    roll        other versions: the previous one's share stays warm, the rest is retired once the desired
                version serves the plan and `old_generation_grace` has passed, each one when its engine has
                no request in flight or `old_generation_drain_timeout` after it began to wait
                (warm_pool/version_roll.py)
    backfill    each zone is started to serving + warm from cold (`pool.started`); a cold pool never starts a
                version its staging check found missing or mismatch (warm_pool/staging.py): the start is
                held and reported, nothing is started in its place

It changes the agent's instances and leases only through its host (the
agent): `admitted`, `register`, `release`, `forget`, `emit`, and
`lost_this_round` for the fault detector.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from common.logs import get_logger
from warm_pool.fault import GONE, Observation
from warm_pool.instance import Instance
from warm_pool.probe import EJECT, Verdict
from warm_pool.states import InstanceState, PoolEvent, transition
from warm_pool.version_roll import Member, RollDecision, decide, infer_previous

if TYPE_CHECKING:
    from warm_pool.agent import Agent

log = get_logger(__name__)

WARM_FAILURES_TO_REPLACE = 3  # consecutive failed health probes before a warm instance is replaced


class PoolReconciler:
    def __init__(self, host: Agent) -> None:
        self.host = host
        self._pool_seq = 0
        self.adopted = False  # the pool a previous agent left running has been taken back
        self.draining: set[asyncio.Task] = set()
        self._desired_seen: str | None = None  # the pool's desired version as of the last reconcile
        self.previous_version: str | None = None  # the one before it: the pool keeps a share warm on it
        self._covered_since: float | None = None  # the desired version serves the plan's count since (monotonic)

    def desired_version(self) -> str | None:
        pool = self.host.settings.pool
        if pool is None:
            return None
        if self.host.snapshot is not None and pool.model in self.host.snapshot.models:
            alias = self.host.snapshot.models[pool.model].aliases.get(pool.alias)
            if alias is not None and alias.version in pool.versions:
                return alias.version
            if alias is not None and self._desired_seen is not None:
                # a version this pool cannot start (not in pool.versions): stay where the pool is rather than
                # roll it to the fallback, which may be older than what it serves
                return self._desired_seen
        return pool.fallback_version()

    async def reconcile_pool(self) -> None:
        pool, driver = self.host.settings.pool, self.host.driver
        if pool is None or driver is None:
            return
        try:
            await driver.refresh()  # observe before acting: which pods / processes exist now
        except Exception as exc:  # the API server away: alive() answers from the last read
            log.warning("pool driver could not re-read its instances", error=repr(exc)[:200])
        now = self.host.clock.now()
        desired = self.desired_version()
        held: dict[tuple[str, str], int] = {}  # (version, zone) → starts refused this reconcile
        for instance in [i for i in self.host.instances.values() if i.origin == "pool"]:
            if not driver.alive(instance.instance_id):
                await self._lose(instance, "the process exited")
            elif instance.state is InstanceState.COLD:
                if self.host.admitted(instance):
                    instance.state = transition(instance.state, PoolEvent.LOADED)
                elif instance.canary is not None and instance.canary.verdict is Verdict.WRONG_OUTPUT:
                    await self._lose(instance, f"admission canary failed: {instance.canary.reason}")
                elif instance.started_at is not None and now - instance.started_at > pool.start_timeout.total_seconds():
                    await self._lose(instance, f"not warm within {pool.start_timeout.total_seconds():g} s")
            elif instance.verdict in EJECT and (instance.verdict is Verdict.WRONG_OUTPUT or
                                                instance.failed_probes >= WARM_FAILURES_TO_REPLACE):
                await self._lose(instance, f"ejected: {instance.reason}")
            elif instance.verdict in EJECT and instance.state is InstanceState.SERVING:
                # Its lease is gone already; a warm one takes its place below. It rides out a blip as warm
                # and is leasable again (a new generation) after a fresh admission canary.
                await self.host.release(instance)
                instance.state = transition(instance.state, PoolEvent.DEMOTED)
                log.warning("serving instance ejected; demoted to warm", instance=instance.instance_id,
                            reason=instance.reason)
                self.host.emit("pool.demoted", instance, f"{instance.zone}: serving → warm: ejected ({instance.reason}); "
                          "leasable again after a fresh canary", state="warm",
                          changes_routing=False)  # the lease went with its verdict (probe.verdict says so)
        mine = [i for i in self.host.instances.values() if i.origin == "pool"]
        previous = self._track_versions(desired, mine)
        target = sum(z.serving for z in pool.zones.values())
        serving = [i for i in mine if i.state is InstanceState.SERVING and i.version == desired]
        while len(serving) < target:
            warm = [i for i in mine if i.state is InstanceState.WARM and i.version == desired
                    and self.host.admitted(i)]
            if not warm:
                break
            short = {z: t.serving - sum(1 for i in serving if i.zone == z) for z, t in pool.zones.items()}
            chosen = max(warm, key=lambda i: (short.get(i.zone, 0) > 0,
                                              sum(1 for w in warm if w.zone == i.zone), i.instance_id))
            for_zone = max(short, key=lambda z: short[z])
            if not await self._promote(chosen, for_zone):
                break
            serving.append(chosen)
        await self._rebalance(mine, desired)
        roll = await self._roll(mine, desired, previous, covered=len(serving) >= target)
        for zone, zone_target in pool.zones.items():
            present = [i for i in mine if i.zone == zone and i.version == desired
                       and i.state in (InstanceState.COLD, InstanceState.WARM, InstanceState.SERVING)]
            for _ in range(zone_target.serving + zone_target.warm - len(present)):
                await self._start(zone, desired, held)
            for _ in range(roll.start_previous.get(zone, 0)):
                await self._start(zone, previous, held)
        if self.host.staging is not None:
            self.host.staging.hold(held)

    def _track_versions(self, desired: str | None, mine: list[Instance]) -> str | None:
        """The previous version: the desired one before the alias last moved (or, for an agent that did not see
        it move, the other version most of the pool runs); None when it is the desired one or unknown."""
        pool = self.host.settings.pool
        if desired is None or pool is None:
            return None
        if self._desired_seen is not None and desired != self._desired_seen:
            log.info("pool version rolls", desired=desired, previous=self._desired_seen)
            self.previous_version, self._covered_since = self._desired_seen, None
        self._desired_seen = desired
        if self.previous_version is None or self.previous_version not in pool.versions:
            self.previous_version = infer_previous(_members(mine), desired=desired, known=pool.versions)
        return self.previous_version if self.previous_version != desired else None

    async def _roll(self, mine: list[Instance], desired: str | None, previous: str | None, *,
                    covered: bool) -> RollDecision:
        """Instances of other versions: keep the previous one's share warm, retire the rest (warm_pool/version_roll.py).

        The old serving set keeps its leases (old_generation: established sessions finish) until the desired
        version serves the plan's count, and `old_generation_grace` longer."""
        pool = self.host.settings.pool
        if pool is None or desired is None:
            return RollDecision()
        now = self.host.clock.now()
        if not covered:
            self._covered_since = None
        elif self._covered_since is None:
            self._covered_since = now
        may_go = covered and now - (self._covered_since or now) >= pool.old_generation_grace.total_seconds()
        deadline = pool.old_generation_drain_timeout.total_seconds()
        mine = [i for i in mine if i.instance_id in self.host.instances]  # the rebalance may have retired one
        members = [Member(i.instance_id, i.zone, i.version, i.state, in_flight=i.in_flight,
                          drain_overdue=now - (i.drain_waiting_since or now) >= deadline)
                   for i in mine if i.state is not None]
        roll = decide(members, desired=desired, previous=previous, old_serving_may_go=may_go,
                      previous_share={z: t.warm_previous for z, t in pool.zones.items()})
        self._wait_for_requests(mine, roll, now)
        for instance_id in roll.demote:
            instance = self.host.instances[instance_id]
            await self.host.release(instance)
            instance.state = transition(instance.state or InstanceState.SERVING, PoolEvent.DEMOTED)
            self.host.emit("pool.demoted", instance, f"{instance.zone}: serving → warm: {desired} serves the plan; "
                      f"{instance.version} stays warm for a rollback", state="warm", changes_routing=True)
        for instance_id in roll.retire:
            instance = self.host.instances[instance_id]
            cut = instance_id in roll.cut
            drain = {"drain_cut": cut, "in_flight": instance.in_flight}
            self.host.metrics.roll_retired.labels("cut" if cut else "idle").inc()
            if cut:
                log.warning("old version retired with requests in flight: the drain deadline passed",
                            instance=instance_id, version=instance.version, in_flight=instance.in_flight,
                            drain_timeout_s=deadline)
            await self._retire(instance, f"{desired} serves the pool; {previous or 'no'} version keeps a warm share; "
                               + (f"drain cut after {deadline:g} s with {_count(instance.in_flight)} in flight "
                                  "(the engine's drain ends them: the gateway resumes them elsewhere)" if cut else
                                  "no request in flight"), **drain)
        return roll

    def _wait_for_requests(self, mine: list[Instance], roll: RollDecision, now: float) -> None:
        """Mark the instances the roll waits on (the agent reads their in-flight counts with their next probe);
        an instance it no longer waits on forgets its count, so a stale 0 never retires it later."""
        waiting = set(roll.waiting)
        for instance in mine:
            if instance.instance_id in waiting and instance.drain_waiting_since is None:
                instance.drain_waiting_since = now
                log.info("old version waits for its requests before it is retired", instance=instance.instance_id,
                         version=instance.version, state=instance.state)
            elif instance.instance_id not in waiting and instance.instance_id not in roll.retire:
                instance.drain_waiting_since, instance.in_flight = None, None
        self.host.metrics.roll_waiting.set(len(waiting))

    async def adopt_pool(self) -> None:
        """Take back the pool instances a previous agent of this region left running (the driver finds them).

        One with a live lease was serving: the lease is taken over (same generation, renewed from the next
        probe), so an agent restart costs no capacity. The others start over as cold: an admission canary,
        then warm. A driver that cannot say (local processes) adopts nothing; a failed read is retried next tick.
        """
        if self.host.driver is None or self.host.settings.pool is None:
            self.adopted = True
            return
        try:
            found = await self.host.driver.adopt()
            leases = {lease.instance_id: lease for lease in await self.host.registry.live()}
        except Exception as exc:
            log.warning("pool not adopted yet; trying again next tick", error=repr(exc)[:200])
            return
        self.adopted = True
        now = self.host.clock.now()
        for pool_instance in found:
            if pool_instance.instance_id in self.host.instances:
                continue
            lease = leases.get(pool_instance.instance_id)
            self.host.instances[pool_instance.instance_id] = Instance(
                pool_instance.instance_id, pool_instance.url, pool_instance.zone, pool_instance.version, "pool",
                first_seen=now, state=InstanceState.SERVING if lease is not None else InstanceState.COLD,
                started_at=now, lease=lease)
            log.info("pool instance adopted", instance=pool_instance.instance_id, zone=pool_instance.zone,
                     version=pool_instance.version, serving=lease is not None)

    async def _rebalance(self, mine: list[Instance], desired: str | None) -> None:
        """One move a tick: a zone short of serving takes its own warm instance, an over-served zone retires one.

        Serving where the plan put it matters for the next loss: the plan's replay assumes each zone
        holds its share of the in-flight sequences. Promote first, then demote, so capacity never dips;
        the retired instance drains (its streams finish or migrate) and is backfilled warm.
        """
        pool = self.host.settings.pool
        if pool is None:
            return
        count = {z: sum(1 for i in mine if i.zone == z and i.state is InstanceState.SERVING and i.version == desired)
                 for z in pool.zones}
        short = [z for z, t in pool.zones.items() if count[z] < t.serving]
        over = sorted((z for z, t in pool.zones.items() if count[z] > t.serving),
                      key=lambda z: count[z] - pool.zones[z].serving, reverse=True)
        for zone in short:
            warm = [i for i in mine if i.zone == zone and i.state is InstanceState.WARM and i.version == desired
                    and self.host.admitted(i)]
            if not warm or not over:
                continue
            victim = next(i for i in mine if i.zone == over[0] and i.state is InstanceState.SERVING
                          and i.version == desired)
            if not await self._promote(warm[0], zone):
                return
            await self._retire(victim, f"{zone} serves its own share again")
            return

    async def _retire(self, instance: Instance, reason: str, **detail: str | int | bool | None) -> None:
        """Serving → draining → gone, and backfill replaces it warm.

        Retired and backfilled rather than demoted to warm in place, as when an instance could be leased
        only once; demoting would now work and save the load (docs/warm_pool.md, limits). The drain
        (SIGTERM: stop taking requests, finish or hand back in-flight ones) runs in the background.
        """
        was = instance.state or InstanceState.SERVING
        await self.host.release(instance)
        instance.state = transition(was, PoolEvent.DRAIN)
        self.host.emit("pool.stopped", instance, f"{instance.zone}: {was} → draining: {reason}", state="draining",
                       changes_routing=was is InstanceState.SERVING, **detail)
        if self.host.driver is not None:
            task = asyncio.create_task(self.host.driver.stop(instance.instance_id, graceful=True),
                                       name=f"drain-{instance.instance_id}")
            self.draining.add(task)
            task.add_done_callback(self.draining.discard)
        instance.state = transition(instance.state, PoolEvent.STOPPED)
        self.host.forget(instance.instance_id)

    async def _start(self, zone: str, version: str | None, held: dict[tuple[str, str], int]) -> None:
        if self.host.driver is None or version is None:
            return
        if self.host.staging is not None and self.host.staging.refusal(version, self.host.snapshot) is not None:
            # Its staged files are not the catalog's: never load them. Nothing else is started in its place
            # (another version takes none of the alias' traffic); the plan is short until a check verifies it.
            held[(version, zone)] = held.get((version, zone), 0) + 1
            return
        self._pool_seq += 1
        instance_id = f"{self.host.settings.region}-{zone}-{self._pool_seq}-{int(self.host.clock.wall())}"
        started = await self.host.driver.start(instance_id=instance_id, zone=zone, version=version)
        now = self.host.clock.now()
        instance = Instance(instance_id, started.url, zone, version, "pool", first_seen=now,
                            state=InstanceState.COLD, started_at=now)
        self.host.instances[instance_id] = instance
        self.host.emit("pool.started", instance, f"backfill {zone}: start {version} cold", state="cold",
                  changes_routing=False)

    async def _promote(self, instance: Instance, for_zone: str) -> bool:
        instance.state = transition(instance.state or InstanceState.WARM, PoolEvent.PROMOTED)
        await self.host.register(instance)
        if instance.lease is None:
            instance.state = transition(instance.state, PoolEvent.DEMOTED)
            if instance.unleasable is not None:
                await self._lose(instance, instance.unleasable)
            return False
        self.host.emit("pool.promoted", instance, f"warm → serving in {instance.zone} for {for_zone}'s shortfall",
                  state="serving", for_zone=for_zone, changes_routing=True)
        return True

    async def _lose(self, instance: Instance, reason: str) -> None:
        was = instance.state
        generation = instance.lease.generation if instance.lease else instance.generation
        await self.host.release(instance)
        if self.host.driver is not None:
            await self.host.driver.stop(instance.instance_id, graceful=False)
        if was is not None and was is not InstanceState.GONE:
            instance.state = transition(was, PoolEvent.LOST)
        self.host.forget(instance.instance_id)
        self.host.lost_this_round.append(Observation(instance.instance_id, instance.zone, GONE, reason, generation))
        self.host.emit("pool.lost", instance, f"{was} instance lost: {reason}", state="gone", was=str(was),
                  changes_routing=was is InstanceState.SERVING)


def _count(in_flight: int | None) -> str:
    return "an unknown number of requests" if in_flight is None else f"{in_flight} request(s)"


def _members(instances: list[Instance]) -> list[Member]:
    return [Member(i.instance_id, i.zone, i.version, i.state) for i in instances if i.state is not None]
