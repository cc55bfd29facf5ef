"""What the `kubernetes` pool driver would send, built without a cluster: valid for Kubernetes 1.33, strict."""

from __future__ import annotations

import kubernetes_validate
import pytest
from kubernetes.client import ApiClient, Configuration

from warm_pool.kubernetes_driver import KubernetesDriver, KubernetesPoolConfig, PoolObjectInvalid


def _driver(region: str = "eu-1", **config) -> KubernetesDriver:
    configuration = Configuration()
    configuration.host = "http://127.0.0.1:9"  # never called: these tests build objects only
    return KubernetesDriver(region=region, config=KubernetesPoolConfig(image="registry.example/lifeline:1", **config),
                            api_client=ApiClient(configuration))


def test_the_deployment_is_valid_pinned_to_its_zone_and_runs_the_version():
    body = _driver(models_claim="models", resources={"limits": {"nvidia.com/gpu": 1}}).deployment("a", "v2", replicas=3)
    kubernetes_validate.validate(body, "1.33.0", strict=True)
    spec = body["spec"]["template"]["spec"]
    [container] = spec["containers"]
    assert body["metadata"]["name"] == "lifeline-eu-1-a-v2" and body["spec"]["replicas"] == 3
    assert body["spec"]["selector"]["matchLabels"] == body["spec"]["template"]["metadata"]["labels"] == {
        "app.kubernetes.io/name": "lifeline-engine", "app.kubernetes.io/managed-by": "lifeline-agent",
        "lifeline.dev/region": "eu-1", "lifeline.dev/zone": "a", "lifeline.dev/version": "v2"}
    assert spec["nodeSelector"] == {"topology.kubernetes.io/zone": "a"}
    assert container["args"][:6] == ["--model", "/models/v2", "--served-model-name", "v2", "--port", "8000"]
    assert "$(POD_NAME)" in container["args"] and container["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert spec["volumes"][0]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}


@pytest.mark.parametrize(
    ("region", "zone", "version", "name"),
    [
        ("eu-1", "a", "v1", "lifeline-eu-1-a-v1"),
        ("EU_1", "a", "Tiny.V2", "lifeline-eu-1-a-tiny-v2-"),
        ("eu-1", "a", "llama-3.1-70b-instruct-2026-11-29-fp8", "lifeline-eu-1-a-llama-3-1-70b-instru"),
    ],
)
def test_deployment_names_are_dns_labels_short_enough_for_their_pods(region, zone, version, name):
    made = _driver(region).deployment_name(zone, version)
    assert made.startswith(name) and len(made) <= 47
    assert made == made.lower() and all(c.isalnum() or c == "-" for c in made) and made[-1] != "-"
    assert made != _driver(region).deployment_name(zone, version + "x")


def test_a_setting_kubernetes_rejects_is_named_before_anything_is_sent():
    with pytest.raises(PoolObjectInvalid, match="'limit' was unexpected"):
        driver = _driver(resources={"limit": {"cpu": "1"}})
        driver.validate(driver.deployment("a", "v1"))
    with pytest.raises(PoolObjectInvalid, match="lifeline.dev/version='v1 final'"):
        _driver().deployment("a", "v1 final")
