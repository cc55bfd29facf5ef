"""Tokenizers of an s3:// version, verified, on moto's S3 server (AWS emulated)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.snapshot import VersionEntry
from gateway.artifacts import ArtifactLoader, ArtifactVerificationFailed
from lifeline.daemons import MotoServer
from tests.support.snapshot_artifacts import write_version


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    server = MotoServer()
    server.start()
    try:
        client = server.client()
        client.create_bucket(Bucket="weights")
        yield client
    finally:
        server.stop()


def _upload(s3: Any, tmp_path: Path, version: str) -> dict[str, str]:
    files = write_version(tmp_path / "src", version)
    for name in files:
        s3.put_object(Bucket="weights", Key=f"tiny/{version}/{name}", Body=(tmp_path / "src" / version / name).read_bytes())
    return files


def _entry(version: str, files: dict[str, str]) -> VersionEntry:
    return VersionEntry(version=version, fingerprint="sha256:x", location=f"s3://weights/tiny/{version}", files=files)


def test_an_s3_version_loads_verified_and_keeps_a_local_copy(s3: Any, tmp_path: Path):
    files = _upload(s3, tmp_path, "v1")
    loaded = ArtifactLoader(download_dir=tmp_path / "dl", s3_client=s3).load(_entry("v1", files))
    assert loaded.tokenizer.encode("c a", add_special_tokens=False).ids == [3, 1]
    assert loaded.max_model_len == 256 and loaded.chat_template
    assert sorted(p.name for p in (tmp_path / "dl" / "v1").iterdir()) == sorted(files)


def test_a_tampered_s3_object_is_refused(s3: Any, tmp_path: Path):
    files = _upload(s3, tmp_path, "v2")
    s3.put_object(Bucket="weights", Key="tiny/v2/config.json", Body=b'{"max_position_embeddings": 999999}')
    with pytest.raises(ArtifactVerificationFailed, match="config.json has sha256"):
        ArtifactLoader(download_dir=tmp_path / "dl", s3_client=s3).load(_entry("v2", files))
    assert not (tmp_path / "dl" / "v2").exists()  # nothing unverified is kept


def test_with_s3_unreadable_the_verified_local_copy_is_used_and_checked(s3: Any, tmp_path: Path):
    files = _upload(s3, tmp_path, "v3")
    ArtifactLoader(download_dir=tmp_path / "dl", s3_client=s3).load(_entry("v3", files))
    for name in files:
        s3.delete_object(Bucket="weights", Key=f"tiny/v3/{name}")
    restarted = ArtifactLoader(download_dir=tmp_path / "dl", s3_client=s3)
    assert restarted.load(_entry("v3", files)).max_model_len == 256
    (tmp_path / "dl" / "v3" / "tokenizer.json").write_text("{}")  # the copy rotted meanwhile
    with pytest.raises(ArtifactVerificationFailed, match="tokenizer.json has sha256"):
        ArtifactLoader(download_dir=tmp_path / "dl", s3_client=s3).load(_entry("v3", files))
