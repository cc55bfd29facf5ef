"""deploy/: every overlay renders, every object is valid Kubernetes 1.33, and the wiring is what docs/deploy.md says.

Offline, as CI runs it: `kubectl kustomize` (Debian's kubernetes-client or
any newer kubectl; the manifests are written in kustomize 2.0.3's dialect)
renders each overlay; `kubernetes_validate` checks each object against the
1.33 schemas with unknown fields refused; checkov lints the rendered output
with the two skips listed in CHECKOV_SKIPS. Then the YAML is parsed and the
promises checked one by one: probes on the endpoints each engine really
serves, a grace period that covers the reference engine's drain, a PDB per
workload, no root, no service links, every `lifeline` flag and
`LIFELINE_*` variable one the code declares, and region configs that load.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer.main
import yaml

from controlplane.config import ControlPlaneSettings
from engine.settings import EngineSettings
from gateway.settings import GatewaySettings
from lifeline.cli import app as lifeline_app
from warm_pool.settings import AgentSettings

ROOT = Path(__file__).resolve().parents[3]
OVERLAYS = ROOT / "deploy" / "overlays"
KUBERNETES_VERSION = "1.33.0"
REGIONS = {"us-east-1": "vllm", "eu-west-1": "vllm", "lab": "reference"}
# Custom resources the manifests use; kubernetes_validate ships no CRD schemas.
# The Prometheus Operator's, from deploy/monitoring: their fields are checked in
# test_monitoring_rules.py. (The HPA's Pods metric is served by prometheus-adapter
# through the aggregated custom.metrics.k8s.io API, which needs no CRD.)
KNOWN_CRDS: frozenset[tuple[str, str]] = frozenset({("monitoring.coreos.com/v1", "PrometheusRule"),
                                                    ("monitoring.coreos.com/v1", "ServiceMonitor")})
CHECKOV_SKIPS = {
    # Tags are pinned per overlay (`images:`); digests are set at release with
    # `kustomize edit set image lifeline=…@sha256:…`, for images built elsewhere.
    "CKV_K8S_43": "image should use digest",
    # Every Lifeline process reads its settings (and so its secrets) from
    # LIFELINE_* variables (pydantic-settings); none reads a secrets file.
    "CKV_K8S_35": "prefer secrets as files over environment variables",
}
WORKLOADS = ("Deployment", "StatefulSet", "Job")
# One replica by design (two would act twice): the regional agent and Celery beat.
SINGLETONS = ("agent", "celery-beat")
# engine/drain.py: after ending the stragglers, their streams get this long to flush.
DRAIN_FLUSH_S = 5.0


def kubectl() -> str:
    found = os.environ.get("LIFELINE_KUBECTL") or shutil.which("kubectl")
    if not found:
        pytest.fail("kubectl not found: install Debian's `kubernetes-client` (`make system-deps` does), "
                    "or point LIFELINE_KUBECTL at a kubectl")
    return found


def checkov() -> str:
    for candidate in (os.environ.get("LIFELINE_CHECKOV"), str(ROOT / ".lifeline" / "tools" / "checkov" / "bin" / "checkov"),
                      shutil.which("checkov")):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.fail("checkov not found: `make system-deps` installs it into .lifeline/tools/checkov "
                "(its own venv: its pins would downgrade boto3 and packaging in .venv)")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out_dir = tmp_path_factory.mktemp("rendered")
    found: dict[str, list[dict[str, Any]]] = {}
    for overlay in sorted(p.parent for p in OVERLAYS.glob("*/kustomization.yaml")):
        result = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"kubectl kustomize {overlay.name}:\n{result.stderr}"
        (out_dir / f"{overlay.name}.yaml").write_text(result.stdout)
        found[overlay.name] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    found["_dir"] = out_dir  # type: ignore[assignment]
    return found


def overlays(rendered: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {name: docs for name, docs in rendered.items() if not name.startswith("_")}


def objects(rendered: dict[str, Any], kind: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, docs in overlays(rendered).items():
        for doc in docs:
            if kind is None or doc["kind"] == kind:
                yield name, doc


def workloads(rendered: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, doc in objects(rendered):
        if doc["kind"] in WORKLOADS:
            yield name, doc


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def containers(workload: dict[str, Any], *, init: bool = True) -> list[dict[str, Any]]:
    spec = pod_spec(workload)
    return (spec.get("initContainers", []) if init else []) + spec["containers"]


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in containers(workload) if c["name"] == name)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_every_overlay_renders_each_region_and_the_control_plane(rendered: dict[str, Any]) -> None:
    assert set(overlays(rendered)) == {"controlplane", *REGIONS}
    for region in REGIONS:
        kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in rendered[region]}
        assert {("Deployment", "gateway"), ("Deployment", "agent"), ("HorizontalPodAutoscaler", "gateway"),
                ("PodDisruptionBudget", "gateway")} <= kinds, region
        namespaces = {doc["metadata"].get("namespace") for doc in rendered[region] if doc["kind"] != "Namespace"}
        assert namespaces == {f"lifeline-{region}"}
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in rendered["controlplane"]}
    assert {("Deployment", "controlplane"), ("Service", "controlplane"), ("Job", "controlplane-migrate"),
            ("PodDisruptionBudget", "controlplane")} <= kinds


def test_every_object_is_valid_kubernetes_with_unknown_fields_refused(rendered: dict[str, Any]) -> None:
    problems = []
    for overlay, doc in objects(rendered):
        what = f"{overlay}: {doc['kind']}/{doc['metadata']['name']}"
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            if (doc["apiVersion"], doc["kind"]) not in KNOWN_CRDS:
                problems.append(f"{what}: no schema for {doc['apiVersion']} {doc['kind']} in {KUBERNETES_VERSION}")
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{what}: {exc.message} at {'.'.join(str(p) for p in exc.path)}")
    assert not problems, "\n".join(problems)


def test_validation_can_fail_on_an_unknown_field() -> None:
    """The check above is only worth something if strict mode refuses a misspelt field."""
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
           "spec": {"ports": [{"port": 80}], "selectr": {"a": "b"}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


def test_checkov_finds_nothing_beyond_the_listed_skips(rendered: dict[str, Any]) -> None:
    result = subprocess.run(
        [checkov(), "-d", str(rendered["_dir"]), "--framework", "kubernetes", "--quiet", "--compact",
         "--skip-download", "--skip-check", ",".join(CHECKOV_SKIPS), "--output", "json"],
        capture_output=True, text=True, timeout=300)
    assert result.stdout.strip(), f"checkov printed nothing (exit {result.returncode}):\n{result.stderr[-3000:]}"
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}"
              for r in reports for c in r.get("results", {}).get("failed_checks", [])]
    assert not failed, "\n".join(failed)
    summary = [r["summary"] for r in reports]
    assert sum(s["parsing_errors"] for s in summary) == 0, summary
    assert sum(s["passed"] for s in summary) > 100, f"checkov scanned next to nothing: {summary}"


def http_probe(probe: dict[str, Any]) -> str:
    return probe["httpGet"]["path"]


def test_reference_engine_probes_live_and_ready_on_their_own_endpoints(rendered: dict[str, Any]) -> None:
    engines = [w for _, w in workloads(rendered) if w["metadata"]["name"].startswith("engine-reference-")]
    assert len(engines) == 2
    for workload in engines:
        engine = container(workload, "engine")
        assert http_probe(engine["livenessProbe"]) == "/healthz/live"
        assert http_probe(engine["readinessProbe"]) == "/healthz/ready"
        assert http_probe(engine["startupProbe"]) == "/healthz/live"


def test_vllm_is_probed_on_health_and_the_agent_holds_its_lease(rendered: dict[str, Any]) -> None:
    for region, engine in REGIONS.items():
        if engine != "vllm":
            continue
        sets = [d for d in rendered[region] if d["kind"] == "StatefulSet"]
        assert {s["metadata"]["name"] for s in sets} == {f"engine-vllm-{region}a", f"engine-vllm-{region}b"}
        agent_config = yaml.safe_load(config_map_file(rendered[region], "agent-config", "agent.yaml"))
        listed = {e["instance_id"]: e for e in agent_config["renew_leases_for"]}
        expected = set()
        for sts in sets:
            vllm = container(sts, "vllm")
            assert {http_probe(vllm[p]) for p in ("livenessProbe", "readinessProbe", "startupProbe")} == {"/health"}
            assert "--registry" not in vllm.get("args", [])  # vLLM has no lease client of its own
            # a stop: preStop (gateways drop the lease the agent released), then vLLM's own drain, in the grace
            pre_stop = vllm["lifecycle"]["preStop"]["exec"]["command"]
            assert pre_stop[0] == "sleep"
            drain = float(flag(vllm["args"], "--shutdown-timeout"))
            assert drain > 0 and pod_spec(sts)["terminationGracePeriodSeconds"] >= float(pre_stop[1]) + drain + 5
            zone = pod_spec(sts)["nodeSelector"]["topology.kubernetes.io/zone"]
            service = sts["spec"]["serviceName"]
            assert any(d["kind"] == "Service" and d["metadata"]["name"] == service
                       and d["spec"].get("clusterIP") == "None" for d in rendered[region])
            for i in range(sts["spec"]["replicas"]):
                pod = f"{sts['metadata']['name']}-{i}"
                expected.add(pod)
                assert listed[pod] == {"url": f"http://{pod}.{service}.lifeline-{region}.svc.cluster.local:8000",
                                       "instance_id": pod, "version": "small-v1", "zone": zone}, pod
        assert set(listed) == expected, "the agent must hold a lease for exactly the vLLM pods"


def test_reference_engine_grace_period_covers_its_drain_and_nothing_delays_sigterm(rendered: dict[str, Any]) -> None:
    for _, workload in workloads(rendered):
        if not workload["metadata"]["name"].startswith("engine-reference-"):
            continue  # vLLM's preStop and drain: test_vllm_is_probed_on_health_and_the_agent_holds_its_lease
        spec = pod_spec(workload)
        for c in spec["containers"]:
            # Kubernetes sends SIGTERM after preStop returns; the engines drain on SIGTERM.
            assert "preStop" not in c.get("lifecycle", {}), f"{workload['metadata']['name']}/{c['name']}"
        if workload["metadata"]["name"].startswith("engine-reference-"):
            args = container(workload, "engine")["args"]
            drain = float(flag(args, "--drain-unroute-wait")) + float(flag(args, "--drain-timeout")) + DRAIN_FLUSH_S
            assert spec["terminationGracePeriodSeconds"] >= drain + 2, (spec["terminationGracePeriodSeconds"], drain)


def test_gateway_and_control_plane_leave_the_service_before_they_stop(rendered: dict[str, Any]) -> None:
    for _, workload in workloads(rendered):
        name = workload["metadata"]["name"]
        if name not in ("gateway", "controlplane"):
            continue
        c = container(workload, name)
        assert http_probe(c["livenessProbe"]) == "/healthz/live"
        assert http_probe(c["readinessProbe"]) == "/healthz/ready"
        pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
        assert pre_stop[0] == "sleep" and 0 < float(pre_stop[1]) < pod_spec(workload)["terminationGracePeriodSeconds"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_every_replicated_workload_has_exactly_one_pdb_and_it_selects_only_that(rendered: dict[str, Any]) -> None:
    for overlay, docs in overlays(rendered).items():
        pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
        pods = {w["metadata"]["name"]: w["spec"]["template"]["metadata"]["labels"]
                for w in docs if w["kind"] in ("Deployment", "StatefulSet")}
        for name, labels in pods.items():
            covering = [p["metadata"]["name"] for p in pdbs if selects(p["spec"]["selector"]["matchLabels"], labels)]
            if name in SINGLETONS:
                assert covering == [], f"{name} is a singleton: a PDB would block node drains"
            else:
                assert covering == [name], f"{overlay}: {name} is covered by {covering}"
        for pdb in pdbs:
            assert pdb["spec"].get("maxUnavailable") == 1, f"{overlay}: {pdb['metadata']['name']}"


def test_nothing_runs_as_root_and_every_container_has_requests_and_limits(rendered: dict[str, Any]) -> None:
    for overlay, workload in workloads(rendered):
        spec, what = pod_spec(workload), f"{overlay}/{workload['metadata']['name']}"
        assert spec["securityContext"]["runAsNonRoot"] is True, what
        assert spec["securityContext"]["runAsUser"] > 0, what
        assert spec["automountServiceAccountToken"] is False, what
        for c in containers(workload):
            security = c["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, (what, c["name"])
            assert security["readOnlyRootFilesystem"] is True, (what, c["name"])
            assert security["capabilities"]["drop"] == ["ALL"], (what, c["name"])
            assert security.get("runAsUser", 1) != 0, (what, c["name"])
            for level in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][level]), (what, c["name"], level)


def test_service_links_are_off_so_no_lifeline_port_variable_is_injected(rendered: dict[str, Any]) -> None:
    """A Service named lifeline-gateway would inject LIFELINE_GATEWAY_PORT=tcp://…, which the settings read."""
    for overlay, workload in workloads(rendered):
        assert pod_spec(workload)["enableServiceLinks"] is False, f"{overlay}/{workload['metadata']['name']}"


def test_engines_are_pinned_per_zone_and_gateways_spread_across_zones(rendered: dict[str, Any]) -> None:
    for region in REGIONS:
        engine_zones = set()
        for workload in rendered[region]:
            if workload["kind"] not in WORKLOADS:
                continue
            spec = pod_spec(workload)
            if workload["metadata"]["name"].startswith("engine-"):
                zone = spec["nodeSelector"]["topology.kubernetes.io/zone"]
                assert workload["spec"]["template"]["metadata"]["labels"]["lifeline.dev/zone"] == zone
                assert workload["metadata"]["name"].endswith(f"-{zone}")
                engine_zones.add(zone)
                for c in spec["containers"]:
                    env = {e["name"]: e.get("value") for e in c.get("env", [])}
                    if "LIFELINE_ENGINE_ZONE" in env or c["name"] == "engine":
                        assert env["LIFELINE_ENGINE_ZONE"] == zone and env["LIFELINE_ENGINE_REGION"] == region
            elif workload["metadata"]["name"] == "gateway":
                [spread] = spec["topologySpreadConstraints"]
                assert spread["topologyKey"] == "topology.kubernetes.io/zone" and spread["maxSkew"] == 1
        assert len(engine_zones) == 2, (region, engine_zones)


def click_command(path: list[str]) -> Any:
    command = typer.main.get_command(lifeline_app)
    consumed = 0
    while hasattr(command, "commands") and consumed < len(path) and path[consumed] in command.commands:
        command = command.commands[path[consumed]]
        consumed += 1
    assert not hasattr(command, "commands"), f"`lifeline {' '.join(path)}` names no command"
    return command, consumed


SETTINGS_FOR = {"engine": EngineSettings, "gateway": GatewaySettings, "agent": AgentSettings,
                "controlplane": ControlPlaneSettings, "catalog": ControlPlaneSettings}


def env_names_a_field(settings: type, name: str) -> bool:
    prefix = settings.model_config["env_prefix"]
    if not name.startswith(prefix):
        return False
    key = name[len(prefix):].lower()
    delimiter = settings.model_config.get("env_nested_delimiter")
    parts = key.split(delimiter) if delimiter else [key]
    model: Any = settings
    for part in parts:
        if model is None or part not in model.model_fields:
            return False
        model = model.model_fields[part].annotation
        model = model if isinstance(model, type) and hasattr(model, "model_fields") else None
    return True


def test_every_lifeline_flag_and_variable_is_one_the_code_declares(rendered: dict[str, Any]) -> None:
    checked = 0
    for overlay, workload in workloads(rendered):
        for c in containers(workload):
            command = c.get("command", [])
            if not command or command[0] != "lifeline":
                continue
            words = command[1:] + c.get("args", [])
            cmd, consumed = click_command(words)
            known = {opt for p in cmd.params for opt in getattr(p, "opts", [])}
            rest = words[consumed:]
            options = [w for w in rest if w.startswith("--")]
            unknown = [o for o in options if o not in known]
            assert not unknown, f"{overlay}/{workload['metadata']['name']}/{c['name']}: {unknown} not in `lifeline {' '.join(words[:consumed])}`"
            settings = SETTINGS_FOR[words[0]]
            for env in c.get("env", []):
                if env["name"].startswith("LIFELINE_"):
                    assert env_names_a_field(settings, env["name"]), (
                        f"{overlay}/{workload['metadata']['name']}/{c['name']}: {env['name']} is no field of "
                        f"{settings.__name__} (prefix {settings.model_config['env_prefix']})")
            checked += 1
    assert checked >= 10


def test_env_check_refuses_a_variable_no_settings_class_reads() -> None:
    assert env_names_a_field(GatewaySettings, "LIFELINE_GATEWAY_REGISTRY__URL")
    assert not env_names_a_field(GatewaySettings, "LIFELINE_GATEWAY_REGISTRY__URI")
    assert not env_names_a_field(EngineSettings, "LIFELINE_GATEWAY_PORT")
    assert not env_names_a_field(AgentSettings, "LIFELINE_AGENT_REGISTRY_URL")


def config_map_file(docs: list[dict[str, Any]], prefix: str, key: str) -> str:
    [config_map] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(f"{prefix}-")]
    return config_map["data"][key]


def secret_env(c: dict[str, Any]) -> dict[str, str]:
    """The container's LIFELINE_* variables with a stand-in value for each secret."""
    stand_in = {"registry-url": "redis://redis.example:6379/0", "token-log-url": "redis://redis.example:6379/1",
                "controlplane-token": "lifeline-token-stand-in"}
    values = {}
    for env in c.get("env", []):
        if not env["name"].startswith("LIFELINE_"):
            continue
        if "value" in env:
            values[env["name"]] = env["value"]
        elif "fieldRef" in env["valueFrom"]:
            values[env["name"]] = "pod-0"
        else:
            values[env["name"]] = stand_in[env["valueFrom"]["secretKeyRef"]["key"]]
    return values


def test_each_region_gateway_and_agent_config_loads_with_its_environment(rendered: dict[str, Any], tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for region in REGIONS:
        docs = rendered[region]
        by_name = {d["metadata"]["name"]: d for d in docs if d["kind"] in WORKLOADS}
        gateway_file = tmp_path / f"{region}-gateway.yaml"
        gateway_file.write_text(config_map_file(docs, "gateway-config", "gateway.yaml"))
        with monkeypatch.context() as env:
            for name, value in secret_env(container(by_name["gateway"], "gateway")).items():
                env.setenv(name, value)
            gateway = GatewaySettings.load(gateway_file)
        assert gateway.region == region and gateway.routing.source == "snapshot"
        assert gateway.registry.kind == "redis" and gateway.registry.url and gateway.token_log.url
        assert gateway.routing.token == "lifeline-token-stand-in" and gateway.replica_id == "pod-0"

        agent = container(by_name["agent"], "agent")
        values = yaml.safe_load(config_map_file(docs, "agent-config", "agent.yaml"))
        args = agent["args"]
        with monkeypatch.context() as env:
            for name, value in secret_env(agent).items():
                env.setenv(name, value)
            settings = AgentSettings(**values, region=flag(args, "--region"), controlplane_url=flag(args, "--controlplane"),
                                     port=int(flag(args, "--port")))
        assert settings.region == region and settings.registry == "redis://redis.example:6379/0"
        assert settings.registry_prefix == gateway.registry.key_prefix, "agent and gateways must share the lease keys"
        assert settings.lease_ttl <= gateway.registry.ttl
        assert settings.controlplane_url == gateway.routing.controlplane_url
        assert settings.snapshot_cache is not None
        mounts = {m["mountPath"] for m in agent["volumeMounts"]}
        assert str(settings.snapshot_cache.parent) in mounts
        gateway_mounts = {m["mountPath"]: m for m in container(by_name["gateway"], "gateway")["volumeMounts"]}
        assert str(gateway.routing.cache_path.parent) in gateway_mounts
        # catalog locations on the models volume: the gateways read tokenizers where the engines read weights
        assert gateway_mounts["/models"]["readOnly"] is True
        claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod_spec(by_name["gateway"])["volumes"]}
        assert claims[gateway_mounts["/models"]["name"]] == "lifeline-models"
        assert any(d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == "lifeline-models" for d in docs)


def test_celery_runs_beside_the_control_plane_with_exactly_one_beat(rendered: dict[str, Any]) -> None:
    docs = overlays(rendered)["controlplane"]
    by_name = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    beat, worker = by_name["celery-beat"], by_name["celery-worker"]
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    assert worker["spec"]["replicas"] >= 2
    for workload, role in ((beat, "beat"), (worker, "worker")):
        c = containers(workload)[0]
        assert c["command"] == ["celery", "-A", "controlplane.celery_app", role]
        env = {e["name"]: e for e in c["env"]}
        assert env["LIFELINE_CONTROLPLANE_CELERY_BROKER_URL"]["valueFrom"]["secretKeyRef"]["key"] == "broker-url"
    args = containers(worker)[0]["args"]
    queues = set(args[args.index("-Q") + 1].split(","))
    from controlplane.replication.config import ReplicationSettings

    # the drill runs' queue and the replication copies' queue: a worker on one alone leaves the other unread
    assert queues == {"celery", ReplicationSettings.model_fields["queue"].default}
