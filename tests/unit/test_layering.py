"""Imports go one way: common ← contract ← engine, gateway, control-plane domains ← composition roots.

Parsed from the source with `ast`, so a function-level import that hides a
cycle counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
LIFELINE_PACKAGES = {"common", "contract", "engine", "gateway", "holder", "controlplane", "weight_catalog", "warm_pool",
                     "cutover", "lifeline", "migrations", "bench", "tests"}

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
