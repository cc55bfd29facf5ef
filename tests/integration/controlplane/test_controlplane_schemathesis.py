"""Property-based fuzzing of the whole admin API from its OpenAPI schema.

Every operation gets a few generated requests (valid and invalid) with an
admin token, on SQLite and PostgreSQL; not one may answer 5xx. S3 locations
resolve against moto's S3 emulator, so generated `s3://` locations reach a
real (emulated) store instead of the internet.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from controlplane.config import ControlPlaneSettings
from lifeline.daemons import MotoServer

pytestmark = pytest.mark.long  # scheduled first in its tier (tests/conftest.py)


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoServer]:
    server = MotoServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def settings_with_s3(settings: ControlPlaneSettings, moto_s3: MotoServer, monkeypatch: pytest.MonkeyPatch,
                     tmp_path: Path) -> ControlPlaneSettings:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return settings.model_copy(update={"s3_endpoint_url": moto_s3.endpoint_url})


MAX_EXAMPLES = 6  # per operation and mode: ~30 operations x 2 modes x 2 databases stays well under a minute


def test_admin_api_never_answers_5xx(
    client: TestClient, settings_with_s3: ControlPlaneSettings, as_role: Any
) -> None:
    # schemathesis' own pytest plugin (from_fixture) does not run under
    # pytest 9, so the operations are driven here with hypothesis directly.
    client.app.state.settings = settings_with_s3
    api = schemathesis.openapi.from_asgi("/openapi.json", client.app)
    headers = as_role("admin")
    server_errors: list[str] = []
    untyped: list[str] = []
    calls: list[int] = []
    # Revoking tokens goes last: a generated revoke may hit the admin token this
    # test authenticates with, and every later call would then only see 401.
    operations = sorted((result.ok() for result in api.get_all_operations()),
                        key=lambda op: op.path.endswith("/revoke"))
    assert len(operations) >= 20
    unauthenticated_before_revoke: list[str] = []

    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                      database=None, phases=[Phase.generate])
            def exercise(case: Any) -> None:
                response = case.call(headers=headers)
                calls.append(response.status_code)
                where = f"{case.method} {case.formatted_path} ({mode.value})"
                if response.status_code == 401 and mode is GenerationMode.POSITIVE and not operation.path.endswith("/revoke"):
                    unauthenticated_before_revoke.append(where)
                if response.status_code >= 500:
                    server_errors.append(f"{where} -> {response.status_code}: {response.text[:200]}")
                elif response.status_code >= 400 and response.status_code != 405:
                    body = response.json()
                    if not isinstance(body.get("error", {}).get("type"), str):
                        untyped.append(f"{where} -> {response.text[:200]}")

            try:
                exercise()
            except Unsatisfiable:
                # An operation with nothing to break (no parameters, no body)
                # has no negative cases.
                if mode is GenerationMode.POSITIVE:
                    raise

    assert len(calls) > 100
    assert any(code < 300 for code in calls) and any(code == 422 for code in calls)
    assert server_errors == []
    assert untyped == []
    assert unauthenticated_before_revoke == []
