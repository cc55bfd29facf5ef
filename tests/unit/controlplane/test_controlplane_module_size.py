"""Every control-plane and catalog module stays under 300 lines, or its docstring says why."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
LIMIT = 300


def test_modules_are_small_or_say_why() -> None:
    too_long = {}
    for package in ("controlplane", "weight_catalog", "migrations"):
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text()
            lines = source.count("\n")
            docstring = ast.get_docstring(ast.parse(source)) or ""
            if lines > LIMIT and "lines" not in docstring:
                too_long[str(path.relative_to(ROOT))] = lines
    assert too_long == {}
