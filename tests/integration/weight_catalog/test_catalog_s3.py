"""Registering and verifying from S3, against moto's S3 emulator over real HTTP."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from controlplane.config import ControlPlaneSettings
from tests.support.controlplane_testing import write_artifact


@pytest.fixture
def settings(database_url: str, tmp_path: Path, moto_s3: Any, monkeypatch: pytest.MonkeyPatch) -> ControlPlaneSettings:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return ControlPlaneSettings(database_url=database_url, data_dir=tmp_path, s3_endpoint_url=moto_s3.endpoint_url,
                                artifact_roots=[tmp_path],
                                hash_workers=3, hash_block_bytes=64 * 1024)


def upload(s3: Any, bucket: str, prefix: str, root: Path) -> None:
    for path in sorted(root.iterdir()):
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{path.name}", Body=path.read_bytes())


def test_register_and_verify_from_s3_prefix_against_moto_s3_emulator(
    client: TestClient, as_role: Any, moto_s3: Any, tmp_path: Path
) -> None:
    s3 = moto_s3.client()
    bucket = f"weights-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    root = write_artifact(tmp_path / "art", shards=3, shard_bytes=300_000)
    upload(s3, bucket, "llama/v1", root)
    s3.put_object(Bucket=bucket, Key="llama/v10/decoy.bin", Body=b"not part of v1")
    op = as_role("operator")

    created = client.post("/api/v1/catalog/models/llama/versions",
                          json={"version": "v1", "location": f"s3://{bucket}/llama/v1"}, headers=op)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["location"] == f"s3://{bucket}/llama/v1"
    assert {s["path"]: s["sha256"] for s in body["shards"]} == {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.iterdir()
    }
    local = client.post("/api/v1/catalog/models/llama/versions", json={"version": "v1-local", "location": str(root)},
                        headers=op).json()
    assert local["fingerprint"] == body["fingerprint"]

    assert client.post("/api/v1/catalog/models/llama/versions/v1/verify", json={}, headers=op).json()["healthy"]
    s3.put_object(Bucket=bucket, Key="llama/v1/model-00001-of-00003.safetensors", Body=b"\x00" * 300_000)
    s3.delete_object(Bucket=bucket, Key="llama/v1/config.json")
    report = client.post("/api/v1/catalog/models/llama/versions/v1/verify", json={}, headers=op).json()
    assert report["healthy"] is False
    assert [m["path"] for m in report["mismatched"]] == ["model-00001-of-00003.safetensors"]
    assert report["missing"] == ["config.json"]

    missing_bucket = client.post("/api/v1/catalog/models/llama/versions",
                                 json={"version": "v2", "location": "s3://no-such-bucket-xyz/p"}, headers=op)
    assert (missing_bucket.status_code, missing_bucket.json()["error"]["type"]) == (422, "invalid_location")
