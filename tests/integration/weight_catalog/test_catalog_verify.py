"""Verify recomputes the semantic fingerprint, and a failed verify blocks promotes without force."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.controlplane_testing import write_artifact

BASE = "/api/v1/catalog/models/llama"


def gain_generation_config(root: Path) -> None:
    (root / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.7}))


def gain_chat_template_file(root: Path) -> None:
    (root / "chat_template.jinja").write_text("{{ messages | tojson }}")


def change_eos(root: Path) -> None:
    config = json.loads((root / "tokenizer_config.json").read_text())
    (root / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|eot|>"}))


DRIFTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "generation_config_appeared": (gain_generation_config, "generation_config"),
    "chat_template_file_appeared": (gain_chat_template_file, "chat_template"),
    "eos_token_changed": (change_eos, "tokenizer_config"),
}


def register(client: TestClient, as_role: Any, tmp_path: Path, version: str, *, bare: bool = False) -> Path:
    root = write_artifact(tmp_path / version)
    if bare:  # no generation config and no chat template yet
        (root / "generation_config.json").unlink()
        config = json.loads((root / "tokenizer_config.json").read_text())
        config.pop("chat_template")
        (root / "tokenizer_config.json").write_text(json.dumps(config))
    response = client.post(f"{BASE}/versions", json={"version": version, "location": str(root)},
                           headers=as_role("operator"))
    assert response.status_code == 201, response.text
    return root


@pytest.mark.parametrize("drift", sorted(DRIFTS))
def test_verify_fails_when_the_semantic_fingerprint_drifted(client: TestClient, as_role: Any, tmp_path: Path,
                                                           drift: str) -> None:
    op = as_role("operator")
    root = register(client, as_role, tmp_path, "v1", bare=True)
    assert client.post(f"{BASE}/versions/v1/verify", json={}, headers=op).json()["healthy"] is True
    apply, part = DRIFTS[drift]
    apply(root)
    report = client.post(f"{BASE}/versions/v1/verify", json={}, headers=op).json()
    assert report["healthy"] is False
    assert report["fingerprint_drift"] == [part]
    assert report["missing"] == []
    # a file that appeared changes no recorded hash: only the fingerprint catches it
    assert [m["path"] for m in report["mismatched"]] == (["tokenizer_config.json"] if part == "tokenizer_config" else [])
    shown = client.get(f"{BASE}/versions/v1", headers=as_role("viewer")).json()
    assert shown["last_verify_healthy"] is False and shown["last_verified_at"].endswith("Z")
    events = client.get("/api/v1/events", params={"kind": "catalog.version.verify"}, headers=op).json()
    assert [e["outcome"] for e in events] == ["succeeded", "failed"]


def test_a_version_whose_last_verify_failed_is_promoted_only_with_force(client: TestClient, as_role: Any,
                                                                       tmp_path: Path) -> None:
    op = as_role("operator")
    register(client, as_role, tmp_path, "v1")
    root = register(client, as_role, tmp_path, "v2")
    assert client.post(f"{BASE}/aliases/prod/promote", json={"version": "v1"}, headers=op).status_code == 200
    (root / "model-00001-of-00003.safetensors").write_bytes(b"corrupt")
    assert client.post(f"{BASE}/versions/v2/verify", json={}, headers=op).json()["healthy"] is False
    refused = client.post(f"{BASE}/aliases/prod/promote", json={"version": "v2"}, headers=op)
    assert (refused.status_code, refused.json()["error"]["type"]) == (409, "last_verify_failed")
    forced = client.post(f"{BASE}/aliases/prod/promote", json={"version": "v2", "force": True, "reason": "drill"},
                         headers=op)
    assert forced.status_code == 200, forced.text
    # rolling back onto a version whose last verify failed is refused too
    assert client.post(f"{BASE}/versions/v1/verify", json={"location": str(root)}, headers=op).json()["healthy"] is False
    back = client.post(f"{BASE}/aliases/prod/rollback", json={"reason": "undo"}, headers=op)
    assert (back.status_code, back.json()["error"]["type"]) == (409, "last_verify_failed")
    assert client.post(f"{BASE}/versions/v1/verify", json={}, headers=op).json()["healthy"] is True
    assert client.post(f"{BASE}/aliases/prod/rollback", json={"reason": "undo"}, headers=op).status_code == 200


def test_cli_verify_reports_drift_and_records_it(database_url: str, session_factory: Any, client: TestClient,
                                                 as_role: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from lifeline.cli import app

    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", database_url)
    root = register(client, as_role, tmp_path, "v1", bare=True)
    gain_generation_config(root)
    result = CliRunner().invoke(app, ["catalog", "verify", "llama", "v1"])
    assert result.exit_code == 1, result.output
    assert "DRIFT    generation_config" in result.output and "UNHEALTHY" in result.output
    assert client.get(f"{BASE}/versions/v1", headers=as_role("viewer")).json()["last_verify_healthy"] is False
    audit = client.get("/api/v1/audit", headers=as_role("admin")).json()
    assert any(r["action"] == "catalog.verify" and r["actor"].startswith("cli:") for r in audit)
