"""The console on the embedded default (SQLite), through FastAPI's TestClient.

The console holds no queries of its own (it calls the domains' services, which
run on both databases in their own suites), so these tests run on SQLite only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.app import create_app
from controlplane.config import ControlPlaneSettings
from controlplane.db import session_scope
from controlplane.topology import service as topology
from controlplane.topology.lease import InMemoryLeaseReader
from controlplane.topology.schemas import ClusterCreate
from tests.support.answer_contract import AnswerContract

CSRF = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')
SIGNIN_CSRF = re.compile(r'name="signin_csrf" value="([^"]+)"')


@pytest.fixture
def console(settings: ControlPlaneSettings, session_factory: Any, clock: ManualClock,
            lease_reader: InMemoryLeaseReader, answer_contract: AnswerContract) -> Iterator[TestClient]:
    app = create_app(settings, clock=clock, lease_reader=lease_reader)
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False, base_url="http://testserver")) as client:
        yield client


@pytest.fixture
def topology_eu(session_factory: Any, clock: ManualClock) -> None:
    """eu (zones eu-a, eu-b; clusters c-eu-a, c-eu-b) and us (us-a; c-us-a), all serving model m."""
    with session_scope(session_factory) as session:
        for region, zones in (("eu", ("eu-a", "eu-b")), ("us", ("us-a",))):
            topology.create_region(session, name=region, description="", actor="test", clock=clock)
            for zone in zones:
                topology.create_zone(session, region=region, name=zone, actor="test", clock=clock)
                topology.create_cluster(session, spec=ClusterCreate(name=f"c-{zone}", region=region, zone=zone,
                                                                    model="m", weight=100),
                                        actor="test", clock=clock)


def sign_in(client: TestClient, secret: str) -> str:
    """Sign in through the form; return the CSRF token of the page it lands on."""
    form = client.get("/console/sign-in")
    assert form.status_code == 200
    signin_csrf = SIGNIN_CSRF.search(form.text).group(1)  # type: ignore[union-attr]
    landed = client.post("/console/sign-in", data={"token": secret, "signin_csrf": signin_csrf,
                                                   "next": "/console/fleet"})
    assert landed.status_code == 200, landed.text
    return csrf_of(landed.text)


def csrf_of(html: str) -> str:
    found = CSRF.search(html)
    assert found, "no CSRF token on the page"
    return found.group(1)


@pytest.fixture
def signed_in(console: TestClient, tokens: dict[str, str]) -> Any:
    def as_role(role: str) -> str:
        console.cookies.clear()
        return sign_in(console, tokens[role])

    return as_role


__all__ = ["Path"]
