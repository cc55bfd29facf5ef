"""Imports go one way: common ← contract ← engine, gateway, control-plane domains ← composition roots.

Parsed from the source with `ast`, so a function-level import that hides a
cycle counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIFELINE_PACKAGES = {"common", "contract", "engine", "gateway", "holder", "controlplane", "weight_catalog", "warm_pool",
                     "cutover", "lifeline", "lifeline_vllm", "migrations", "bench", "tests"}

# package → the Lifeline packages it may import (besides itself)
ALLOWED = {
    "common": set(),
    "contract": {"common"},
    "engine": {"common", "contract"},
    "gateway": {"common", "contract"},
    # the memory holder outlives engines; engines reach it over HTTP (engine/holder_client.py, contract/holder.py)
    "holder": {"common", "contract"},
    # the regional agent reaches engines, the registry and the control plane over HTTP and Redis
    "warm_pool": {"common", "contract"},
    # runs inside vLLM's own venv: the reference engine's sampling rule (pure torch) and the records, no more
    "lifeline_vllm": {"contract", "engine"},
}


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & LIFELINE_PACKAGES


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_downward(package: str) -> None:
    offenders = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        upward = imported_packages(path) - ALLOWED[package] - {package}
        if upward:
            offenders[str(path.relative_to(ROOT))] = sorted(upward)
    assert offenders == {}


def test_nothing_outside_tests_imports_the_tests_package() -> None:
    offenders = [str(p.relative_to(ROOT)) for pkg in LIFELINE_PACKAGES - {"tests"} if (ROOT / pkg).is_dir()
                 for p in sorted((ROOT / pkg).rglob("*.py")) if "tests" in imported_packages(p)]
    assert offenders == []


def test_gateway_and_control_plane_start_without_torch() -> None:
    """torch is the `engine` extra: importing the other processes (and the CLI) must not need it."""
    import subprocess
    import sys

    code = ("import sys, gateway.app, gateway.cli, controlplane.app, lifeline.cli; "
            "heavy = sorted(m for m in ('torch', 'transformers', 'safetensors') if m in sys.modules); "
            "print(heavy); sys.exit(1 if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# --- control plane: module-level layers --------------------------------------------------------------------------
#
# `controlplane/` holds shared pieces, domains and the composition root side by side, and
# `weight_catalog/` and `cutover/` are domains of it, so the rule is per module, not per package. Layers, lowest first; a
# module may import `common`, `contract`, any lower layer and its own unit, never a higher layer nor another
# unit of its own layer (topology and the catalog do not know each other).

CONTROL_PLANE_LAYERS: list[dict[str, str]] = [
    # shared pieces (one unit: they may use each other): no domain, no Alembic
    {"controlplane.config": "shared", "controlplane.db": "shared", "controlplane.errors": "shared",
     "controlplane.body_limit": "shared", "controlplane.statement_deadline": "shared",
     "controlplane.types": "shared", "controlplane.deps": "shared", "controlplane.latest_report": "shared",
     "controlplane.bounded_scrape": "shared"},
    # who is asking
    {"controlplane.auth": "auth"},
    # what every writer uses: the event log, the routing-state version, audited CLI units of work, health
    {"controlplane.event": "event", "controlplane.routing_version": "routing_version",
     "controlplane.cli_support": "cli_support", "controlplane.health": "health"},
    # the domains that hold routing state and data-plane reports
    {"controlplane.topology": "topology", "weight_catalog": "weight_catalog",
     "controlplane.gateway_report": "gateway_report", "controlplane.drill": "drill"},
    # the mesh tier's routes, which name versions the catalog's aliases point at
    {"controlplane.mesh_route": "mesh_route"},
    # the reader over the routing domains: the snapshot (topology, catalog, mesh routes)
    {"controlplane.snapshot": "snapshot"},
    # cutovers: they act on routing state through the topology, the mesh routes and the snapshot, read the gateways'
    # reports back, and their drivers file states the dns TTLs the SLO documents cite; nothing below knows them
    {"cutover": "cutover"},
    # drills (use the event log) and the SLO documents that cite their runs
    {"controlplane.drill": "drill"},
    {"controlplane.slo": "slo"},
    # alerts that act: through the escalation ladder and the drills
    {"controlplane.alerts": "alerts"},
    # the composition root
    {"controlplane.app": "root", "controlplane.api": "root", "controlplane.cli": "root", "controlplane.schema": "root",
     "controlplane.celery_app": "root", "controlplane.console": "root",  # the console composes every domain
     "migrations": "root", "lifeline": "root"},
]


DOMAIN_LAYER = 3  # where a controlplane package not listed above is placed: a new domain


def _control_plane_unit(module: str) -> tuple[int, str] | None:
    best: tuple[int, str, int] | None = None
    for layer, units in enumerate(CONTROL_PLANE_LAYERS):
        for prefix, unit in units.items():
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[2]):
                best = (layer, unit, len(prefix))
    if best is None and module.startswith("controlplane."):
        return DOMAIN_LAYER, module.split(".")[1]
    return (best[0], best[1]) if best else None


def _imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _control_plane_files() -> list[tuple[str, Path]]:
    files = []
    for package in ("controlplane", "weight_catalog", "cutover"):
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            if module != "controlplane":  # the package's own docstring-only __init__
                files.append((module, path))
    return files


def test_control_plane_modules_import_only_downward() -> None:
    offenders: dict[str, list[str]] = {}
    for module, path in _control_plane_files():
        own = _control_plane_unit(module)
        assert own is not None
        for imported in _imported_modules(path):
            target = _control_plane_unit(imported)
            if target is None or target[1] == own[1]:
                continue
            if target[0] >= own[0]:
                offenders.setdefault(module, []).append(imported)
    assert offenders == {}


# The warm pool's capacity plan is warm_pool's (its agent's CLI prints it) and the control plane serves the
# same plan (`/api/v1/pool/plan`), so the control plane may import that one pure module, and no other.
DATA_PLANE_MODULES_THE_CONTROL_PLANE_RUNS = {"warm_pool.capacity"}


def test_control_plane_imports_no_data_plane_internals() -> None:
    offenders = {}
    for module, path in _control_plane_files():
        imported = {m for m in _imported_modules(path)
                    if not any(m == shared or m.startswith(shared + ".")
                               for shared in DATA_PLANE_MODULES_THE_CONTROL_PLANE_RUNS)}
        internals = {m.split(".")[0] for m in imported} & {"engine", "gateway", "warm_pool", "holder"}
        if internals:
            offenders[module] = sorted(internals)
    assert offenders == {}


@pytest.mark.parametrize("module", sorted(DATA_PLANE_MODULES_THE_CONTROL_PLANE_RUNS))
def test_what_the_control_plane_runs_of_the_data_plane_imports_only_contract(module: str) -> None:
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    assert imported_packages(path) <= {"common", "contract"}


def test_every_top_level_package_is_installed() -> None:
    """A package missing from pyproject's list works from the repository root and nowhere else."""
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert sorted(p for p in packages if f"{p}*" not in include) == []
