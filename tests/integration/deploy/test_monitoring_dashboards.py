"""The Grafana dashboards: written from code, every query valid PromQL (promtool) over series the code exports.

No Grafana runs here (it is not a Debian package); what can be checked without
one is: the files are what deploy/monitoring/dashboards.py writes (Grafana's
Foundation SDK builds them), promtool parses every query, every metric a query
reads is exported by the code, the ids a deep link names are fixed and unique,
and the control-plane overlay ships them as a ConfigMap Grafana's sidecar loads.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.integration.deploy.test_monitoring_rules import MONITORING, exported_series, promtool

DASHBOARDS = MONITORING / "controlplane" / "dashboards"


def generator() -> Any:
    spec = importlib.util.spec_from_file_location("lifeline_dashboards", MONITORING / "dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def written() -> dict[str, dict[str, Any]]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f"{board['uid']}#{panel['id']}", target["expr"]) for panel in board["panels"]
            for target in panel["targets"]]


def test_the_written_dashboards_are_what_the_generator_builds() -> None:
    module = generator()
    assert sorted(written()) == sorted(board.uid for board in module.BOARDS)
    for board in module.BOARDS:
        assert (DASHBOARDS / f"{board.uid}.json").read_text() == module.render(board), (
            f"{board.uid}: run .venv/bin/python deploy/monitoring/dashboards.py")


def test_every_query_is_promql_that_promtool_accepts(tmp_path: Path) -> None:
    rules = [{"record": f"lifeline_dashboard:query_{i}", "expr": expr.replace("$region", ".*")}
             for i, (_, expr) in enumerate(q for board in written().values() for q in queries(board))]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    checked = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert len(rules) >= 20


def test_every_metric_a_query_reads_is_one_the_code_exports() -> None:
    exported = exported_series()
    unknown = [f"{where}: {name}" for board in written().values() for where, expr in queries(board)
               for name in re.findall(r"\blifeline_[a-z0-9_]+", re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr))
               if name not in exported]
    assert not unknown, "dashboards read series nothing exports:\n" + "\n".join(unknown)


def test_uids_and_panel_ids_are_fixed_unique_and_panels_do_not_overlap() -> None:
    boards = written()
    assert len({b["uid"] for b in boards.values()}) == len(boards)
    for board in boards.values():
        ids = [panel["id"] for panel in board["panels"]]
        assert len(set(ids)) == len(ids) and all(isinstance(i, int) and i > 0 for i in ids), board["uid"]
        cells = [(x, y) for p in board["panels"] for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
                 for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])]
        assert len(cells) == len(set(cells)), f"{board['uid']}: panels overlap"
        assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "region"}


def test_the_control_plane_overlay_ships_the_dashboards_to_grafanas_sidecar(tmp_path: Path) -> None:
    import shutil

    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not installed (make system-deps installs it)"
    rendered = subprocess.run([kubectl, "kustomize", str(MONITORING / "controlplane")], capture_output=True,
                              text=True, check=True).stdout
    maps = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ConfigMap"]
    [dashboards] = [m for m in maps if m["metadata"]["name"].startswith("lifeline-dashboards")]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert sorted(dashboards["data"]) == sorted(f"{uid}.json" for uid in written())
    assert all(json.loads(text)["uid"] for text in dashboards["data"].values())


def test_every_panel_the_console_links_to_exists() -> None:
    from controlplane.console.dashboards import LINKED_PANELS

    panels = {(board["uid"], panel["id"]) for board in written().values() for panel in board["panels"]}
    assert set(LINKED_PANELS) <= panels, set(LINKED_PANELS) - panels
