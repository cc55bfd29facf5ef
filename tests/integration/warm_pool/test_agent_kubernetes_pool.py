"""The agent's pool reconciler with `pool.driver: kubernetes`, against the Kubernetes API emulator.

The driver is built from the agent's settings (`build_driver`), talks to
`lifeline/kube_emulator.py` through the real `kubernetes` client, and the
agent reconciles the pool as it does with local processes: fill each zone,
lease the serving ones, lose a node, promote warm, backfill by claiming the
ReplicaSet's replacement pod, give the zone its serving share back and
retire the lender's extra. The pods' engines (at their pod IPs) are
scripted over httpx: the emulator runs no containers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from common.clock import ManualClock
from lifeline.kube_emulator import KubeApiEmulator
from tests.unit.warm_pool.test_pool_agent import RECORD, MemoryRegistry, ScriptedEngine, settle
from warm_pool.agent import Agent
from warm_pool.budget import ProbeBudget
from warm_pool.driver import LocalDriver, PoolDriverError, build_driver
from warm_pool.events import EventShipper
from warm_pool.kubernetes_driver import LABEL_INSTANCE, KubernetesDriver
from warm_pool.settings import AgentSettings
from warm_pool.states import InstanceState

NS = "lifeline"
ZONES = {"a": {"serving": 1, "warm": 1}, "b": {"serving": 1, "warm": 0}}


@pytest.fixture
def emulator() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator(kubernetes_version="1.33.0") as api:
        yield api


def kubernetes_pool(emulator: KubeApiEmulator, **extra: object) -> dict:
    return {"driver": "kubernetes", "model": "m", "versions": {"v1": "/models/tiny-v1"}, "zones": ZONES,
            "kubernetes": {"image": "registry.example/lifeline:1", "namespace": NS, "api_url": emulator.url,
                           "poll_interval": 0.01, "claim_timeout": 2, "resync_interval": 3600, **extra}}


class Kubelet:
    """Each pod's engine at its pod IP: a scripted engine named after the pod, as `$(POD_NAME)` names it."""

    def __init__(self, emulator: KubeApiEmulator, driver: KubernetesDriver) -> None:
        self.emulator, self.driver = emulator, driver
        self.engines: dict[str, ScriptedEngine] = {}

    def pods(self) -> list[dict]:
        return [pod for zone in ZONES for pod in self.emulator.pods_of(self.driver.deployment_name(zone, "v1"), NS)]

    def transport(self) -> httpx.MockTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            pod = next((p for p in self.pods() if p["status"].get("podIP") == request.url.host), None)
            if pod is None:
                raise httpx.ConnectError("no route to host: the pod is gone")
            labels = pod["metadata"]["labels"]
            engine = self.engines.setdefault(pod["metadata"]["name"], ScriptedEngine(
                pod["metadata"]["name"], zone=labels["lifeline.dev/zone"], version=labels["lifeline.dev/version"]))
            return engine.handle(request)
        return httpx.MockTransport(handler)


def held_pods(kubelet: Kubelet) -> dict[str, str]:
    """instance id → pod name, for the pods the agent claimed and is not deleting."""
    return {p["metadata"]["labels"][LABEL_INSTANCE]: p["metadata"]["name"] for p in kubelet.pods()
            if LABEL_INSTANCE in p["metadata"]["labels"] and not p["metadata"].get("deletionTimestamp")}


async def test_agent_reconciles_a_kubernetes_pool_through_a_lost_node(emulator: KubeApiEmulator) -> None:
    settings = AgentSettings(region="eu-1", pool=kubernetes_pool(emulator))
    driver = build_driver(settings.region, settings.pool)
    assert isinstance(driver, KubernetesDriver)
    kubelet = Kubelet(emulator, driver)
    clock, registry, shipper = ManualClock(), None, EventShipper(None, None)
    registry = MemoryRegistry(clock)
    shipper.url = "kept"  # keep events in the buffer for the test to read
    agent = Agent(settings, registry=registry, http=httpx.AsyncClient(transport=kubelet.transport()), clock=clock,
                  shipper=shipper, canary_records={"v1": RECORD}, driver=driver,
                  budget=ProbeBudget(clock, per_instance_per_s=settings.canary_per_instance_per_s))
    try:
        await settle(agent, clock, 4)
        states = sorted((i.zone, i.state) for i in agent.instances.values())
        assert states == [("a", InstanceState.SERVING), ("a", InstanceState.WARM), ("b", InstanceState.SERVING)]
        a, b = driver.deployment_name("a", "v1"), driver.deployment_name("b", "v1")
        assert (emulator.deployments[(NS, a)]["spec"]["replicas"], emulator.deployments[(NS, b)]["spec"]["replicas"]) \
            == (2, 1)
        assert set(held_pods(kubelet)) == set(agent.instances)  # every instance is a pod it claimed
        container = emulator.deployments[(NS, a)]["spec"]["template"]["spec"]["containers"][0]
        assert container["args"][:2] == ["--model", "/models/tiny-v1"]  # pool.versions names the pod's directory
        serving_b = next(i for i in agent.instances.values() if i.zone == "b")
        assert {lease.instance_id for lease in await registry.live()} == {
            i.instance_id for i in agent.instances.values() if i.state is InstanceState.SERVING}

        emulator.interfere(2)  # another writer on the Deployments: the driver's scale writes conflict and retry
        emulator.kill_pod(held_pods(kubelet)[serving_b.instance_id], namespace=NS)  # b's node is lost
        # The probes see the pod gone at once; the driver sees it when its watch delivers the deletion (another
        # thread). Tick once the watch has: before, the agent demotes it on its failed probe and loses it a
        # tick later, which is right but not what this tick asserts.
        for _ in range(200):
            if not driver.alive(serving_b.instance_id):
                break
            await asyncio.sleep(0.01)
        await settle(agent, clock)
        assert serving_b.instance_id not in agent.instances
        assert serving_b.instance_id not in {lease.instance_id for lease in await registry.live()}
        kinds = [(e.kind, e.instance_id) for e in shipper.buffer]
        assert ("pool.lost", serving_b.instance_id) in kinds
        lost_at = kinds.index(("pool.lost", serving_b.instance_id))
        [promoted] = [e for e in list(shipper.buffer)[lost_at:] if e.kind == "pool.promoted"]
        assert (promoted.detail["zone"], promoted.detail["for_zone"]) == ("a", "b")  # a's warm took b's share at once

        for _ in range(8):  # b is backfilled from the ReplicaSet's replacement pod and takes its share back
            await settle(agent, clock)
            emulator.finish_terminations()
        serving = sorted(i.zone for i in agent.instances.values() if i.state is InstanceState.SERVING)
        assert serving == ["a", "b"]
        assert sorted((i.zone, i.state) for i in agent.instances.values()) == [
            ("a", InstanceState.SERVING), ("a", InstanceState.WARM), ("b", InstanceState.SERVING)]
        for _ in range(200):  # the retired instance drains in the background (driver.stop): its delete, its scale-down
            if emulator.deployments[(NS, a)]["spec"]["replicas"] == 2 and set(held_pods(kubelet)) == set(agent.instances):
                break
            await asyncio.sleep(0.01)
        assert set(held_pods(kubelet)) == set(agent.instances)
        emulator.finish_terminations()  # the retired pod's graceful delete ends: it leaves the kubelet's list
        assert (emulator.deployments[(NS, a)]["spec"]["replicas"], emulator.deployments[(NS, b)]["spec"]["replicas"]) \
            == (2, 1)
        assert len(kubelet.pods()) == 3  # no spare left behind
        assert driver.conflicts_retried >= 1
        assert promoted.instance_id in [e.instance_id for e in shipper.buffer if e.kind == "pool.stopped"]
    finally:
        await agent.close()


async def test_a_restarted_agent_adopts_the_pool_it_left_running(emulator: KubeApiEmulator) -> None:
    settings = AgentSettings(region="eu-1", pool=kubernetes_pool(emulator))
    clock = ManualClock()
    registry = MemoryRegistry(clock)  # the region's registry outlives the agent

    def agent_on(driver: KubernetesDriver, kubelet: Kubelet) -> Agent:
        shipper = EventShipper(None, None)
        shipper.url = "kept"
        return Agent(settings, registry=registry, http=httpx.AsyncClient(transport=kubelet.transport()), clock=clock,
                     shipper=shipper, canary_records={"v1": RECORD}, driver=driver,
                     budget=ProbeBudget(clock, per_instance_per_s=settings.canary_per_instance_per_s))

    first_driver = build_driver(settings.region, settings.pool)
    assert isinstance(first_driver, KubernetesDriver)
    kubelet = Kubelet(emulator, first_driver)
    first = agent_on(first_driver, kubelet)
    await settle(first, clock, 4)
    before = {i.instance_id: (i.zone, i.state, i.lease.generation if i.lease else None)
              for i in first.instances.values()}
    pods_before = held_pods(kubelet)
    await first_driver.close()  # the agent process dies: no leases released, no pods stopped

    second_driver = build_driver(settings.region, settings.pool)
    assert isinstance(second_driver, KubernetesDriver)
    second = agent_on(second_driver, Kubelet(emulator, second_driver))
    try:
        await settle(second, clock, 4)
        after = {i.instance_id: (i.zone, i.state, i.lease.generation if i.lease else None)
                 for i in second.instances.values()}
        assert after == before  # the same pods, the serving ones under the same lease generations
        assert held_pods(kubelet) == pods_before and len(kubelet.pods()) == 3  # nothing started beside them
        assert not [e for e in second.shipper.buffer if e.kind == "pool.started"]
        assert {lease.instance_id for lease in await registry.live()} == {
            i for i, (_, state, _) in after.items() if state is InstanceState.SERVING}
    finally:
        await second.close()


def test_pool_driver_settings_are_typed_per_driver(tmp_path: Path, emulator: KubeApiEmulator) -> None:
    local = AgentSettings(region="eu-1", pool={"model": "m", "versions": {"v1": str(tmp_path)}, "zones": ZONES,
                                              "state_dir": str(tmp_path)})
    assert isinstance(build_driver("eu-1", local.pool), LocalDriver)
    refused = {
        "pool.state_dir is required": {"model": "m", "versions": {"v1": "x"}, "zones": ZONES},
        "pool.driver: kubernetes needs pool.kubernetes": {**kubernetes_pool(emulator), "kubernetes": None},
        "pool.kubernetes is set but pool.driver is local": {**kubernetes_pool(emulator), "driver": "local",
                                                           "state_dir": str(tmp_path)},
        "pool.state_dir is for the local driver": {**kubernetes_pool(emulator), "state_dir": str(tmp_path)},
        "set api_url or kubeconfig, not both": kubernetes_pool(emulator, kubeconfig=str(tmp_path / "k")),
        "image": {**kubernetes_pool(emulator), "kubernetes": {"namespace": NS}},
        "Extra inputs are not permitted": kubernetes_pool(emulator, replicas=3),
        "Input should be 'local' or 'kubernetes'": {**kubernetes_pool(emulator), "driver": "nomad"},
    }
    for says, pool in refused.items():
        with pytest.raises(ValidationError, match=says):
            AgentSettings(region="eu-1", pool=pool)
    missing = AgentSettings(region="eu-1", pool=kubernetes_pool(emulator, api_url=None,
                                                                kubeconfig=str(tmp_path / "absent")))
    with pytest.raises(PoolDriverError, match="pool.kubernetes.kubeconfig"):
        build_driver("eu-1", missing.pool)
    in_cluster = AgentSettings(region="eu-1", pool=kubernetes_pool(emulator, api_url=None))
    with pytest.raises(PoolDriverError, match="in-cluster"):  # no service account on this machine
        build_driver("eu-1", in_cluster.pool)
