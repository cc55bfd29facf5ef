"""deploy/monitoring/: the Prometheus rules pass promtool's checks and unit tests, read only metrics the code
exports, and reach the kustomize overlays unchanged, with ServiceMonitors that scrape what the rules read.

Offline, as CI runs it: promtool comes from Debian's `prometheus` package
(`make system-deps` installs it; only the binary is used), kubectl renders
the overlays as test_deploy_manifests.py does. A missing promtool fails the
test rather than skipping it, since CI installs it. kubernetes_validate knows
no CRDs (KNOWN_CRDS there), so the PrometheusRule and ServiceMonitor fields
are checked here against the subset of the Prometheus Operator's
monitoring.coreos.com/v1 schemas the manifests use, unknown fields refused.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "lifeline-rules.yaml"
UNIT_TESTS = sorted((MONITORING / "tests").glob("*.yaml"))
OVERLAYS = ROOT / "deploy" / "overlays"
REGIONS = ("us-east-1", "eu-west-1", "lab")
# Where the code defines the metrics it exports (prometheus_client), and the scrape-time collector's families.
METRIC_SOURCES = ("controlplane", "gateway", "warm_pool", "engine", "cutover", "weight_catalog", "lifeline", "holder",
                  "contract", "common")
SEVERITIES = {"critical", "warning", "info"}


def promtool() -> str:
    found = os.environ.get("LIFELINE_PROMTOOL") or shutil.which("promtool")
    if not found:
        pytest.fail("promtool not found: install Debian's `prometheus` package (`make system-deps` does), "
                    "or point LIFELINE_PROMTOOL at a promtool")
    return found


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], check=False, capture_output=True, text=True, timeout=120, cwd=ROOT)


def plain_rules() -> dict[str, Any]:
    return yaml.safe_load(RULES.read_text())


def alerts(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("lifeline_monitoring_generate", MONITORING / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- promtool ---------------------------------------------------------------------------------------


def test_rule_file_passes_promtool_check() -> None:
    result = run_promtool("check", "rules", str(RULES.relative_to(ROOT)))
    assert result.returncode == 0, f"promtool check rules:\n{result.stdout}\n{result.stderr}"


def test_every_alert_fires_and_stays_quiet_as_its_promtool_unit_tests_say() -> None:
    assert UNIT_TESTS, "no promtool unit tests under deploy/monitoring/tests"
    result = run_promtool("test", "rules", *(str(p.relative_to(ROOT)) for p in UNIT_TESTS))
    assert result.returncode == 0, f"promtool test rules:\n{result.stdout}\n{result.stderr}"
    assert result.stdout.count("SUCCESS") == len(UNIT_TESTS), result.stdout


def test_every_alert_has_a_firing_case_and_a_quiet_case() -> None:
    """A rule nobody tested firing could never fire; one nobody tested quiet could page all day."""
    cases: dict[str, set[bool]] = {}
    for path in UNIT_TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    for rule in alerts(plain_rules()["groups"]):
        assert cases.get(rule["alert"]) == {True, False}, f"{rule['alert']}: tested {cases.get(rule['alert'])}"


def test_every_alert_waits_names_a_severity_and_says_what_to_do() -> None:
    names = set()
    for rule in alerts(plain_rules()["groups"]):
        what = rule["alert"]
        assert what.startswith("Lifeline") and what not in names, what
        names.add(what)
        assert "for" in rule, f"{what}: no `for:` (0m for an event read from a counter's window)"
        assert rule["labels"]["severity"] in SEVERITIES, what
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook"}, what
        assert all(annotations[k].strip() for k in annotations), what
        assert "\n" not in annotations["runbook"], f"{what}: the runbook is one line"


# -- the metrics the rules read ---------------------------------------------------------------------

DEFINITION = re.compile(r"\b(Counter|Gauge|Histogram|Summary)\(\s*\"([a-zA-Z_:][a-zA-Z0-9_:]*)\"")
FAMILY = re.compile(r"\b(gauge|counter)\(\"([a-z0-9_]+)\"|\b(Gauge|Counter)MetricFamily\(PREFIX \+ \"([a-z0-9_]+)\"")
WHOLE_FAMILY = re.compile(r"\b(Gauge|Counter)MetricFamily\(\s*\"([a-z0-9_]+)\"")


def exported_series() -> set[str]:
    """Every series name the code's prometheus_client definitions expose, with the suffixes it adds."""
    names: set[str] = set()
    for package in METRIC_SOURCES:
        for path in (ROOT / package).rglob("*.py"):
            source = path.read_text()
            for kind, name in DEFINITION.findall(source):
                if kind == "Counter":
                    base = name.removesuffix("_total")
                    names |= {f"{base}_total", f"{base}_created"}
                elif kind in ("Histogram", "Summary"):
                    names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created", name}
                else:
                    names.add(name)
            for kind, name in WHOLE_FAMILY.findall(source):
                names.add(f"{name}_total" if kind == "Counter" else name)
            prefix = re.search(r"^PREFIX = \"([a-z0-9_]+)\"", source, re.MULTILINE)
            if prefix is None:
                continue
            if "(BoundedCollector)" in source:  # controlplane/bounded_scrape.py adds <prefix>scrape_ok
                names.add(prefix.group(1) + "scrape_ok")
            for small_kind, small_name, big_kind, big_name in FAMILY.findall(source):
                kind, name = (small_kind or big_kind).lower(), prefix.group(1) + (small_name or big_name)
                names.add(f"{name}_total" if kind == "counter" else name)
    return names


def test_the_metric_scan_finds_what_the_code_exports() -> None:
    """The scan below is only worth something if it sees the definitions it claims to."""
    from gateway.metrics import GatewayMetrics
    from warm_pool.agent import AgentMetrics

    exported = exported_series()
    suffix = {"counter": "_total", "gauge": "", "histogram": "_bucket"}
    for registry in (GatewayMetrics().registry, AgentMetrics().registry):
        for family in registry.collect():  # labelled families have no samples before their first use
            assert family.name + suffix[family.type] in exported, family.name
    assert {"lifeline_controlplane_replication_lag_rpo_ratio", "lifeline_controlplane_replication_scrape_ok",
            "lifeline_controlplane_cutovers", "lifeline_controlplane_cutover_scrape_ok",
            "lifeline_controlplane_replication_replicated_total", "lifeline_drill_runs_total",
            "lifeline_cutover_escalation_decisions_total", "lifeline_controlplane_requests_total"} <= exported


def test_every_metric_the_rules_read_is_one_the_code_exports() -> None:
    rules = [rule for group in plain_rules()["groups"] for rule in group["rules"]]
    recorded = {rule["record"] for rule in rules if "record" in rule}
    exported = exported_series()
    unknown = []
    for rule in rules:
        expr = re.sub(r"\"(?:[^\"\\]|\\.)*\"", '""', rule["expr"])  # label values are no metric names
        for name in re.findall(r"\b(?:lifeline|vllm)[a-zA-Z0-9_:]*", expr):
            if name not in (recorded if name.startswith("lifeline:") else exported):
                unknown.append(f"{rule.get('alert') or rule.get('record')}: {name}")
    assert not unknown, "the rules read series nothing exports:\n" + "\n".join(unknown)


# -- the PrometheusRules and ServiceMonitors the overlays install -----------------------------------


def test_prometheus_rules_carry_exactly_the_plain_rule_files_groups() -> None:
    written = {path: yaml.safe_load(path.read_text()) for path in generator().TARGETS.values()}
    plain = plain_rules()["groups"]
    wrapped = [group for doc in written.values() for group in doc["spec"]["groups"]]
    assert sorted(wrapped, key=lambda g: g["name"]) == sorted(plain, key=lambda g: g["name"]), (
        "a PrometheusRule differs from deploy/monitoring/lifeline-rules.yaml: "
        "run `.venv/bin/python deploy/monitoring/generate.py`")
    for path, doc in written.items():
        prefix = "lifeline.controlplane." if path.parent.name == "controlplane" else "lifeline.region."
        assert doc["spec"]["groups"] == [g for g in plain if g["name"].startswith(prefix)], path


def test_generated_files_are_what_the_generator_writes() -> None:
    for path, text in generator().render().items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)}: run `.venv/bin/python deploy/monitoring/generate.py`"


def test_the_generator_refuses_a_group_it_would_leave_out() -> None:
    with pytest.raises(ValueError, match="lifeline.ops"):
        generator().split_groups({"groups": [{"name": "lifeline.ops", "rules": []}]})


def test_each_prometheus_rule_passes_promtool_check(tmp_path: Path) -> None:
    for path in generator().TARGETS.values():
        spec = tmp_path / f"{path.parent.name}.yaml"
        spec.write_text(yaml.safe_dump(yaml.safe_load(path.read_text())["spec"]))
        result = run_promtool("check", "rules", str(spec))
        assert result.returncode == 0, f"{path.relative_to(ROOT)}:\n{result.stdout}\n{result.stderr}"


# The fields these manifests use, of the Prometheus Operator's CRDs (monitoring.coreos.com/v1).
_OBJECT_META = {"type": "object", "required": ["name"], "additionalProperties": False,
                "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                               "labels": {"type": "object", "additionalProperties": {"type": "string"}}}}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                          r"(([0-9]+)s)?(([0-9]+)ms)?)$"}
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
PROMETHEUS_RULE = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"},
        "metadata": _OBJECT_META,
        "spec": {"type": "object", "required": ["groups"], "additionalProperties": False, "properties": {
            "groups": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                "properties": {"name": {"type": "string"}, "interval": _DURATION, "rules": {"type": "array", "items": {
                    "type": "object", "required": ["expr"], "additionalProperties": False,
                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                    "properties": {"alert": {"type": "string"}, "record": {"type": "string"},
                                   "expr": {"type": "string"}, "for": _DURATION, "labels": _STRINGS,
                                   "annotations": _STRINGS}}}}}}}}}}
_RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}},
    "targetLabel": {"type": "string"}, "regex": {"type": "string"}, "replacement": {"type": "string"},
    "separator": {"type": "string"},
    "action": {"enum": ["replace", "keep", "drop", "labelmap", "labeldrop", "labelkeep"]}}}
SERVICE_MONITOR = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
        "metadata": _OBJECT_META,
        "spec": {"type": "object", "required": ["selector", "endpoints"], "additionalProperties": False, "properties": {
            "selector": {"type": "object", "additionalProperties": False, "required": ["matchLabels"],
                         "properties": {"matchLabels": _STRINGS}},
            "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
            "endpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["port"], "additionalProperties": False, "properties": {
                    "port": {"type": "string"}, "path": {"type": "string"}, "scheme": {"enum": ["http", "https"]},
                    "interval": _DURATION, "scrapeTimeout": _DURATION, "honorLabels": {"type": "boolean"},
                    "relabelings": {"type": "array", "items": _RELABEL},
                    "metricRelabelings": {"type": "array", "items": _RELABEL}}}}}}}}
SCHEMAS = {"PrometheusRule": PROMETHEUS_RULE, "ServiceMonitor": SERVICE_MONITOR}


def kubectl() -> str:
    found = os.environ.get("LIFELINE_KUBECTL") or shutil.which("kubectl")
    if not found:
        pytest.fail("kubectl not found: install Debian's `kubernetes-client` (`make system-deps` does), "
                    "or point LIFELINE_KUBECTL at a kubectl")
    return found


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    found = {}
    for overlay in ("controlplane", *REGIONS):
        result = subprocess.run([kubectl(), "kustomize", str(OVERLAYS / overlay)], check=False, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 0, f"kubectl kustomize {overlay}:\n{result.stderr}"
        found[overlay] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return found


def test_the_crd_checks_refuse_a_misspelt_field() -> None:
    """As test_validation_can_fail_on_an_unknown_field does for the built-in kinds."""
    bad = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": {"name": "x"},
           "spec": {"selector": {"matchLabels": {"a": "b"}}, "endpoints": [{"port": "http", "intervall": "30s"}]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SERVICE_MONITOR)


def test_every_overlay_installs_its_rules_and_a_service_monitor(rendered: dict[str, list[dict[str, Any]]]) -> None:
    module = generator()
    plain = yaml.safe_load(RULES.read_text())["groups"]
    for overlay, docs in rendered.items():
        monitoring = [d for d in docs if d["apiVersion"] == "monitoring.coreos.com/v1"]
        monitors = ["ServiceMonitor"] * (1 if overlay == "controlplane" else 2)  # a region's: gateways, agent
        assert sorted(d["kind"] for d in monitoring) == ["PrometheusRule", *monitors], overlay
        namespace = "lifeline-system" if overlay == "controlplane" else f"lifeline-{overlay}"
        for doc in monitoring:
            jsonschema.validate(doc, SCHEMAS[doc["kind"]])
            assert doc["metadata"]["namespace"] == namespace, (overlay, doc["kind"])
        [rule] = [d for d in monitoring if d["kind"] == "PrometheusRule"]
        prefix = "lifeline.controlplane." if overlay == "controlplane" else "lifeline.region."
        assert rule["spec"]["groups"] == [g for g in plain if g["name"].startswith(prefix)], overlay
        assert module.TARGETS[prefix].is_file()


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_each_service_monitor_scrapes_pods_that_serve_metrics_to_it(rendered: dict[str, list[dict[str, Any]]]) -> None:
    """Service → pods → a named container port the pods' NetworkPolicy admits from anywhere, with /metrics on it."""
    from controlplane.metrics import router as controlplane_routes
    from gateway.health_routes import router as gateway_routes

    serves_metrics = {"lifeline-controlplane": {r.path for r in controlplane_routes.routes},
                      "lifeline-gateway": {r.path for r in gateway_routes.routes},
                      "lifeline-agent": {"/metrics"}}  # prometheus_client's own server (warm_pool/agent.py)
    for overlay, docs in rendered.items():
        for monitor in [d for d in docs if d["kind"] == "ServiceMonitor"]:
            services = [d for d in docs if d["kind"] == "Service"
                        and selects(monitor["spec"]["selector"]["matchLabels"], d["metadata"].get("labels", {}))]
            assert len(services) == 1, (overlay, [s["metadata"]["name"] for s in services])
            [service] = services
            [endpoint] = monitor["spec"]["endpoints"]
            [port] = [p for p in service["spec"]["ports"] if p.get("name") == endpoint["port"]]
            pods = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                    and selects(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])]
            assert len(pods) == 1, (overlay, service["metadata"]["name"])
            [workload] = pods
            labels = workload["spec"]["template"]["metadata"]["labels"]
            ports = {p["name"]: p["containerPort"] for c in workload["spec"]["template"]["spec"]["containers"]
                     for p in c.get("ports", [])}
            container_port = ports[port["targetPort"]]
            policies = [d for d in docs if d["kind"] == "NetworkPolicy"
                        and selects(d["spec"]["podSelector"].get("matchLabels", {}), labels)]
            assert policies, (overlay, workload["metadata"]["name"])
            assert any("from" not in rule and any(p.get("port") == container_port for p in rule.get("ports", []))
                       for policy in policies for rule in policy["spec"].get("ingress", [])), (
                f"{overlay}: no NetworkPolicy admits a scraper on {workload['metadata']['name']}:{container_port}")
            assert endpoint["path"] in serves_metrics[labels["app.kubernetes.io/name"]]
            for relabel in endpoint.get("relabelings", []):
                for source in relabel["sourceLabels"]:
                    label = source.removeprefix("__meta_kubernetes_pod_label_")
                    assert any(re.sub(r"[^a-zA-Z0-9_]", "_", k) == label for k in labels), (overlay, source)
            if overlay in REGIONS:
                assert labels["lifeline.dev/region"] == overlay  # the rules group region alerts by it
