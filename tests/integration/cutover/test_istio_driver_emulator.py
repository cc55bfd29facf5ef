"""The mesh tier's Istio driver: the real `kubernetes` client against the emulated API server.

No Kubernetes API server runs here, so `lifeline.kube_emulator` stands in
for it (and for istiod's status reports); every test name says so. The
driver reads each change back from the emulated server to verify it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from kubernetes.client import ApiClient, Configuration

from common.clock import ManualClock, SystemClock
from controlplane.db import session_scope
from cutover import flows, service as cutover_service
from cutover.drivers.base import DriverRejected, DriverUnavailable, MeshState, MeshTarget, VerificationFailed
from cutover.drivers.istio import IstioVirtualServiceDriver
from cutover.errors import MeshNoDestinationLeft
from cutover.drivers.snapshot_l7 import SnapshotL7Driver
from cutover.models import CutoverMode
from cutover.scope import Scope, ScopeKind, TargetState
from contract.routing_tier import RoutingTier
from cutover.runtime import CutoverRuntime
from cutover.drivers.adapter import TierDriverAdapter
from lifeline.kube_emulator import KubeApiEmulator
from tests.integration.cutover.test_cutover_support import (  # noqa: F401 - fixtures
    policy,
    read_factory,
    topology_two_regions,
)

NS = "serving"
HOST = "llm.serving.svc.cluster.local"
TIMEOUT = timedelta(seconds=2)


def _virtual_service(weights: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "llm", "namespace": NS},
        "spec": {"hosts": [HOST], "http": [
            {"name": "canary", "match": [{"headers": {"x-lifeline-cohort": {"exact": "canary"}}}],
             "route": [{"destination": {"host": HOST, "subset": "canary"}, "weight": 100}]},
            {"name": "default", "route": [{"destination": {"host": HOST, "subset": s}, "weight": w}
                                          for s, w in weights.items()]},
        ]},
    }


@pytest.fixture
def emulator() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator(kubernetes_version="1.33.0") as api:
        api.add_virtual_service(_virtual_service({"eu-a": 50, "eu-b": 50}))
        yield api


@pytest.fixture
def api_client(emulator: KubeApiEmulator) -> Iterator[ApiClient]:
    configuration = Configuration()
    configuration.host = emulator.url
    client = ApiClient(configuration)
    yield client
    client.close()


@pytest.fixture
def driver(api_client: ApiClient) -> IstioVirtualServiceDriver:
    return IstioVirtualServiceDriver(api_client)


def _target(*zones: str) -> MeshTarget:
    return MeshTarget(namespace=NS, virtual_service="llm", route="default",
                      destinations=tuple(f"{HOST}/{z}" for z in zones))


def _weights(emulator: KubeApiEmulator, route: str = "default") -> dict[str, int]:
    spec = emulator.virtual_service("llm", NS)["spec"]
    found = next(r for r in spec["http"] if r["name"] == route)
    return {d["destination"]["subset"]: d["weight"] for d in found["route"]}


def _out(driver: IstioVirtualServiceDriver, target: MeshTarget) -> MeshState:
    before = driver.read_state(target)
    return before.model_copy(update={"weights": {k: (0 if k in target.destinations else 100)
                                                 for k in before.weights}})


def test_emulated_istio_zone_weight_to_zero_is_read_back_and_restored(
        driver: IstioVirtualServiceDriver, emulator: KubeApiEmulator) -> None:
    target = _target("eu-a")
    before = driver.read_state(target)
    assert before.weights == {f"{HOST}/eu-a": 50, f"{HOST}/eu-b": 50} and before.reconciled
    out = _out(driver, target)
    driver.apply(out)
    proof = driver.verify(out, TIMEOUT)
    assert proof.verified and proof.measured_from == "apply"
    assert "observedGeneration=2" in proof.evidence and f"{HOST}/eu-a=0" in proof.evidence
    assert _weights(emulator) == {"eu-a": 0, "eu-b": 100}
    assert _weights(emulator, "canary") == {"canary": 100}  # the other route is untouched
    restored = driver.restore(before, TIMEOUT)
    assert restored.verified and _weights(emulator) == {"eu-a": 50, "eu-b": 50}


def test_emulated_istio_write_survives_resource_version_conflicts(
        driver: IstioVirtualServiceDriver, emulator: KubeApiEmulator) -> None:
    emulator.interfere_virtual_service(2)
    out = _out(driver, _target("eu-b"))
    driver.apply(out)
    assert driver.verify(out, TIMEOUT).verified
    puts = [r.status for r in emulator.writes("PUT")]
    assert puts == [409, 409, 200]
    vs = emulator.virtual_service("llm", NS)
    assert vs["metadata"]["annotations"]["example.com/touched-by"] == "another-writer"  # theirs kept, ours landed


def test_emulated_istio_conflicts_that_never_end_are_unavailable_and_change_nothing(
        api_client: ApiClient, emulator: KubeApiEmulator) -> None:
    driver = IstioVirtualServiceDriver(api_client, conflict_retries=1)
    emulator.interfere_virtual_service(100)
    out = _out(driver, _target("eu-a"))
    with pytest.raises(DriverUnavailable, match="kept changing"):
        driver.apply(out)
    assert _weights(emulator) == {"eu-a": 50, "eu-b": 50}


def test_emulated_istio_unpushed_spec_does_not_verify_until_istiod_reconciles(
        driver: IstioVirtualServiceDriver, emulator: KubeApiEmulator) -> None:
    out = _out(driver, _target("eu-a"))
    emulator.pause_istiod()
    driver.apply(out)
    with pytest.raises(VerificationFailed) as failed:
        driver.verify(out, timedelta(seconds=0.2))
    seen = failed.value.verification
    assert seen.observed.weights == out.weights and not seen.observed.reconciled
    assert "generation=2 observedGeneration=1" in seen.evidence
    emulator.resume_istiod()
    assert driver.verify(out, TIMEOUT).verified


def test_emulated_istio_refuses_unknown_routes_and_destinations_changing_nothing(
        driver: IstioVirtualServiceDriver, emulator: KubeApiEmulator) -> None:
    with pytest.raises(DriverRejected, match="no http route 'blue'"):
        driver.read_state(MeshTarget(namespace=NS, virtual_service="llm", route="blue", destinations=("x",)))
    with pytest.raises(DriverRejected, match="404"):
        driver.read_state(MeshTarget(namespace=NS, virtual_service="nope", route="default", destinations=("x",)))
    target = _target("eu-a")
    wrong = MeshState(target=target, weights={f"{HOST}/eu-a": 0, f"{HOST}/eu-c": 100})
    with pytest.raises(DriverRejected, match="has destinations"):
        driver.apply(wrong)
    sums_to_90 = MeshState(target=target, weights={f"{HOST}/eu-a": 0, f"{HOST}/eu-b": 90})
    with pytest.raises(DriverRejected, match="422.*total destination weight 90 != 100"):
        driver.apply(sums_to_90)
    assert _weights(emulator) == {"eu-a": 50, "eu-b": 50}
    assert [r.status for r in emulator.writes("PUT")] == [422]


def test_emulated_istio_unreachable_api_server_is_unavailable() -> None:
    configuration = Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard port: nothing listens
    client = ApiClient(configuration)
    try:
        with pytest.raises(DriverUnavailable, match="unreachable"):
            IstioVirtualServiceDriver(client, request_timeout_s=(0.2, 0.2), sleep=lambda _: None).read_state(
                _target("eu-a"))
    finally:
        client.close()


# ---------------------------------------------------------------- through the workflow


@pytest.fixture
def mesh_runtime(session_factory: Any, read_factory: Any, clock: ManualClock, policy: Any,  # noqa: F811
                 driver: IstioVirtualServiceDriver) -> CutoverRuntime:
    l7 = SnapshotL7Driver(session_factory, read_factory=read_factory, clock=clock, sleep=clock.advance,
                          poll_interval_s=0.1)
    targets = {"region:eu/zone:eu-a": [_target("eu-a")], "region:eu/zone:eu-b": [_target("eu-b")]}
    istio = TierDriverAdapter(driver, tier=RoutingTier.MESH, name="istio",
                              targets_for=lambda scope: targets.get(scope.key, []))
    return CutoverRuntime(factory=session_factory, clock=clock, drivers=[l7, istio], policy=policy)


@pytest.mark.usefixtures("topology_two_regions")
def test_emulated_istio_mesh_cutover_of_a_zone_completes_and_rolls_back(
        mesh_runtime: CutoverRuntime, emulator: KubeApiEmulator) -> None:
    with session_scope(mesh_runtime.factory) as session:
        cutover, _ = cutover_service.plan(
            session, mesh_runtime, scope=Scope(ScopeKind.ZONE, "eu", "eu-a"), tiers=[RoutingTier.MESH],
            target_state=TargetState.OUT, reason="eu-a packet loss", mode=CutoverMode.MANUAL, actor="op")
        cutover_id = cutover.id
        assert [s.expected_after.weights for s in cutover.steps] == [{f"{HOST}/eu-a": 0, f"{HOST}/eu-b": 100}]
    assert _weights(emulator) == {"eu-a": 50, "eu-b": 50}  # plan changes nothing
    done = flows.execute(mesh_runtime, cutover_id=cutover_id, idempotency_key="k1", actor="op")
    assert done.state == "completed"
    assert _weights(emulator) == {"eu-a": 0, "eu-b": 100}
    with session_scope(mesh_runtime.factory) as session:
        step = cutover_service.get_or_raise(session, cutover_id=cutover_id).steps[0]
        assert step.tier == "mesh" and step.evidence["verified"] and step.evidence["tier"] == "mesh"
    back = flows.rollback(mesh_runtime, cutover_id=cutover_id, actor="op", reason="recovered")
    assert back.state == "rolled_back"
    assert _weights(emulator) == {"eu-a": 50, "eu-b": 50}


@pytest.mark.usefixtures("topology_two_regions")
def test_emulated_istio_mesh_cutover_refuses_to_empty_a_route(
        mesh_runtime: CutoverRuntime, emulator: KubeApiEmulator, driver: IstioVirtualServiceDriver) -> None:
    driver.apply(_out(driver, _target("eu-b")))  # eu-b already out: eu-a is all that is left
    with session_scope(mesh_runtime.factory) as session, pytest.raises(MeshNoDestinationLeft):
        cutover_service.plan(
            session, mesh_runtime, scope=Scope(ScopeKind.ZONE, "eu", "eu-a"), tiers=[RoutingTier.MESH],
            target_state=TargetState.OUT, reason="eu-a", mode=CutoverMode.MANUAL, actor="op")
    assert _weights(emulator) == {"eu-a": 100, "eu-b": 0}


@pytest.mark.parametrize("how", ["kubeconfig", "host-and-token"])
def test_emulated_istio_driver_built_from_the_drivers_file_reads_and_writes(
        emulator: KubeApiEmulator, tmp_path: Any, how: str) -> None:
    import yaml

    from cutover.drivers_file import CutoverDriversConfig
    from cutover.runtime import build_drivers

    if how == "kubeconfig":
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "emulator",
            "clusters": [{"name": "emulator", "cluster": {"server": emulator.url}}],
            "users": [{"name": "lifeline", "user": {"token": "t0ken"}}],
            "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "lifeline"}}]}))
        access: dict[str, Any] = {"kubeconfig": kubeconfig}
    else:
        (tmp_path / "token").write_text("t0ken\n")
        access = {"host": emulator.url, "token_file": tmp_path / "token"}
    config = CutoverDriversConfig.model_validate({"istio": {**access, "routes": [
        {"scope": "region:eu/zone:eu-a", "namespace": NS, "virtual_service": "llm", "route": "default",
         "destinations": [f"{HOST}/eu-a"]}]}})
    (istio,) = build_drivers(config, clock=SystemClock())
    eu_a = Scope(ScopeKind.ZONE, "eu", "eu-a")
    (target,) = istio.targets(eu_a)
    before = istio.read_state(target)
    out = istio.desired(before, TargetState.OUT)
    istio.apply(out)
    assert istio.verify(out, TIMEOUT).verified and _weights(emulator) == {"eu-a": 0, "eu-b": 100}
    assert istio.targets(Scope(ScopeKind.ZONE, "eu", "eu-b")) == []
