"""The `kubernetes` pool driver, through the real `kubernetes` client, against the Kubernetes API emulator.

`lifeline/kube_emulator.py` serves exactly the calls the driver makes on
loopback HTTP, with resourceVersion conflicts, a ReplicaSet controller and
strict `kubernetes_validate` on every body it receives (422 otherwise), so a
driver that skipped its own validation would fail here too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import timedelta

import pytest
from kubernetes.client import ApiClient, AppsV1Api, Configuration
from kubernetes.client.exceptions import ApiException

from lifeline.kube_emulator import KubeApiEmulator
from tests.support.waiting import until
from warm_pool.kubernetes_driver import (
    LABEL_INSTANCE,
    KubernetesDriver,
    KubernetesPoolConfig,
    PoolDriverError,
    PoolObjectInvalid,
)

NS = "lifeline"


@pytest.fixture
def emulator() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator(kubernetes_version="1.33.0") as api:
        yield api


@pytest.fixture
def api_client(emulator: KubeApiEmulator) -> Iterator[ApiClient]:
    configuration = Configuration()
    configuration.host = emulator.url
    client = ApiClient(configuration)
    yield client
    client.close()


def _config(**overrides) -> KubernetesPoolConfig:
    return KubernetesPoolConfig(image="registry.example/lifeline:1", namespace=NS, models_claim="models",
                                poll_interval=timedelta(seconds=0.01), claim_timeout=timedelta(seconds=2),
                                resync_interval=timedelta(seconds=60), **overrides)


@pytest.fixture
async def driver(api_client: ApiClient) -> AsyncIterator[KubernetesDriver]:
    pool = KubernetesDriver(region="eu-1", config=_config(), api_client=api_client)
    yield pool
    await pool.close()


def _pod(emulator: KubeApiEmulator, deployment: str, instance_id: str) -> dict:
    [pod] = [p for p in emulator.pods_of(deployment, NS) if p["metadata"]["labels"].get(LABEL_INSTANCE) == instance_id]
    return pod


def _replicas(emulator: KubeApiEmulator, deployment: str) -> int:
    return emulator.deployments[(NS, deployment)]["spec"]["replicas"]


async def test_start_scales_one_deployment_per_zone_and_version_and_labels_the_pod(driver, emulator):
    a = await driver.start(instance_id="eu-1-a-1", zone="a", version="v1")
    b = await driver.start(instance_id="eu-1-b-2", zone="b", version="v1")
    c = await driver.start(instance_id="eu-1-a-3", zone="a", version="v1")
    d = await driver.start(instance_id="eu-1-a-4", zone="a", version="v2")

    assert sorted(name for _, name in emulator.deployments) == [
        "lifeline-eu-1-a-v1", "lifeline-eu-1-a-v2", "lifeline-eu-1-b-v1"]
    assert (_replicas(emulator, "lifeline-eu-1-a-v1"), _replicas(emulator, "lifeline-eu-1-b-v1"),
            _replicas(emulator, "lifeline-eu-1-a-v2")) == (2, 1, 1)
    pod = _pod(emulator, "lifeline-eu-1-a-v1", "eu-1-a-3")
    assert c.url == f"http://{pod['status']['podIP']}:8000" and len({a.url, b.url, c.url, d.url}) == 4
    assert pod["spec"]["nodeSelector"] == {"topology.kubernetes.io/zone": "a"}
    assert pod["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"] == "1000"
    assert all(r.status < 400 for r in emulator.writes())  # every body passed the emulator's strict validation


async def test_stop_removes_the_retired_pod_not_a_loading_one_and_scales_down(driver, emulator):
    await driver.start(instance_id="warm-1", zone="a", version="v1")
    await driver.start(instance_id="cold-2", zone="a", version="v1")
    emulator.set_ready(_pod(emulator, "lifeline-eu-1-a-v1", "warm-1")["metadata"]["name"], namespace=NS)
    warm_pod = _pod(emulator, "lifeline-eu-1-a-v1", "warm-1")["metadata"]["name"]

    # A scale-down alone would make the ReplicaSet remove the not-ready (loading) pod, not the ready one.
    await driver.stop("warm-1", graceful=True)
    assert emulator.deleted == [(warm_pod, None)]  # its own grace period: SIGTERM, the engine drains
    assert _replicas(emulator, "lifeline-eu-1-a-v1") == 1
    emulator.finish_terminations()
    pods = emulator.pods_of("lifeline-eu-1-a-v1", NS)
    assert [p["metadata"]["labels"].get(LABEL_INSTANCE) for p in pods] == ["cold-2"]  # the spare went too

    await driver.stop("cold-2", graceful=False)
    assert emulator.deleted[-1][1] == 0 and _replicas(emulator, "lifeline-eu-1-a-v1") == 0
    assert emulator.pods_of("lifeline-eu-1-a-v1", NS) == []


async def test_a_conflicting_write_is_reread_and_retried_without_losing_either_change(driver, emulator):
    await driver.start(instance_id="eu-1-a-1", zone="a", version="v1")
    emulator.interfere(2)  # another writer changes the Deployment between the driver's read and its write, twice

    await driver.start(instance_id="eu-1-a-2", zone="a", version="v1")

    conflicts = [r for r in emulator.requests if r.method == "PUT" and r.status == 409]
    assert len(conflicts) == 2 and driver.conflicts_retried == 2
    deployment = emulator.deployments[(NS, "lifeline-eu-1-a-v1")]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["annotations"]["example.com/touched-by"] == "another-writer"


async def test_conflicts_past_the_retries_fail_the_start(api_client, emulator):
    driver = KubernetesDriver(region="eu-1", config=_config(conflict_retries=2), api_client=api_client)
    emulator.interfere(3)
    with pytest.raises(PoolDriverError, match="3 conflicts in a row"):
        await driver.start(instance_id="eu-1-a-1", zone="a", version="v1")
    await driver.close()


async def test_readiness_and_a_lost_pod_are_read_back_by_a_list_without_the_watch(api_client, emulator):
    driver = KubernetesDriver(region="eu-1", config=_config(watch=False), api_client=api_client)
    await driver.start(instance_id="eu-1-a-1", zone="a", version="v1")
    pod = _pod(emulator, "lifeline-eu-1-a-v1", "eu-1-a-1")["metadata"]["name"]
    assert driver.alive("eu-1-a-1") and not driver.ready("eu-1-a-1")

    emulator.set_ready(pod, namespace=NS)
    await driver.refresh()
    assert driver.ready("eu-1-a-1")

    emulator.kill_pod(pod, namespace=NS)  # node lost: the ReplicaSet makes an unheld replacement
    await driver.refresh()
    assert not driver.alive("eu-1-a-1") and not driver.ready("eu-1-a-1")
    assert [p["metadata"]["labels"].get(LABEL_INSTANCE) for p in emulator.pods_of("lifeline-eu-1-a-v1", NS)] == [None]

    await driver.stop("eu-1-a-1", graceful=False)  # the agent loses it: the spare is scaled away
    assert _replicas(emulator, "lifeline-eu-1-a-v1") == 0 and emulator.pods_of("lifeline-eu-1-a-v1", NS) == []


async def test_the_next_start_claims_a_lost_pods_replacement_instead_of_scaling(driver, emulator):
    await driver.start(instance_id="eu-1-a-1", zone="a", version="v1")
    emulator.kill_pod(_pod(emulator, "lifeline-eu-1-a-v1", "eu-1-a-1")["metadata"]["name"], namespace=NS)
    puts = len(emulator.writes("PUT"))

    started = await driver.start(instance_id="eu-1-a-2", zone="a", version="v1")

    [pod] = emulator.pods_of("lifeline-eu-1-a-v1", NS)
    assert pod["metadata"]["labels"][LABEL_INSTANCE] == "eu-1-a-2" and started.url.startswith(f"http://{pod['status']['podIP']}:")
    assert len(emulator.writes("PUT")) == puts and _replicas(emulator, "lifeline-eu-1-a-v1") == 1


async def test_an_invalid_object_is_refused_by_validation_before_anything_is_sent(api_client, emulator):
    driver = KubernetesDriver(region="eu-1", config=_config(resources={"limit": {"nvidia.com/gpu": 1}}),
                              api_client=api_client)
    with pytest.raises(PoolObjectInvalid, match="'limit' was unexpected"):
        await driver.start(instance_id="eu-1-a-1", zone="a", version="v1")
    assert emulator.writes() == [] and emulator.deployments == {}
    with pytest.raises(PoolObjectInvalid, match="not a valid Kubernetes label value"):
        await driver.start(instance_id="eu-1 a 1", zone="a", version="v1")
    await driver.close()


def test_the_emulator_refuses_what_the_api_server_would(api_client, emulator):
    """What makes the tests above able to fail: a body the schema rejects is a 422, as on a cluster."""
    body = KubernetesDriver(region="eu-1", config=_config(), api_client=api_client).deployment("a", "v1")
    body["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(ApiException) as refused:
        AppsV1Api(api_client).create_namespaced_deployment(NS, body)
    assert refused.value.status == 422 and emulator.deployments == {}


async def test_the_watch_streams_readiness_and_a_lost_pod_without_a_list(driver, emulator):
    await driver.start(instance_id="eu-1-a-1", zone="a", version="v1")
    pod = _pod(emulator, "lifeline-eu-1-a-v1", "eu-1-a-1")["metadata"]["name"]
    await until(lambda: driver.watching and emulator.watches == 1, "the watch is open", timeout=10.0)
    lists = _pod_lists(emulator)

    emulator.set_ready(pod, namespace=NS)
    await until(lambda: driver.ready("eu-1-a-1"), "readiness streamed", timeout=10.0)
    emulator.kill_pod(pod, namespace=NS)
    await until(lambda: not driver.alive("eu-1-a-1"), "the lost pod streamed", timeout=10.0)
    await driver.refresh()  # the agent's per-tick re-read: from the watch, no call
    assert not driver.alive("eu-1-a-1") and _pod_lists(emulator) == lists and driver.watch_events >= 2


async def test_an_expired_watch_is_listed_again_and_misses_nothing(driver, emulator):
    await driver.start(instance_id="eu-1-a-1", zone="a", version="v1")
    pod = _pod(emulator, "lifeline-eu-1-a-v1", "eu-1-a-1")["metadata"]["name"]
    await until(lambda: driver.watching and emulator.watches == 1, "the watch is open", timeout=10.0)

    emulator.expire_watches()  # etcd compacted: the open watch ends; resuming from its version is 410 Gone
    emulator.set_ready(pod, namespace=NS)
    await until(lambda: driver.watch_relists == 1 and driver.ready("eu-1-a-1"), "listed again after 410", timeout=10.0)
    await until(lambda: driver.watching and emulator.watches >= 2, "watching again", timeout=10.0)
    emulator.kill_pod(pod, namespace=NS)
    await until(lambda: not driver.alive("eu-1-a-1"), "the resumed watch streams the loss", timeout=10.0)
    assert (driver.watch_relists, emulator.watches >= 2, driver.alive("eu-1-a-1")) == (1, True, False)


def _pod_lists(emulator: KubeApiEmulator) -> int:
    return sum(1 for r in emulator.requests if r.method == "GET" and r.path == f"/api/v1/namespaces/{NS}/pods")
