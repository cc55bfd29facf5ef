"""Control-plane and catalog integration tests run on SQLite and on the real PostgreSQL.

Needs PostgreSQL at 127.0.0.1:5432 (trust auth, user postgres, database
`test`; override with LIFELINE_TEST_POSTGRES_URL). One throwaway database
per backend per session, built by `alembic upgrade head` and dropped after;
tables are emptied before each test.

Every answer a test gets from a control-plane client built here (`client`,
or any client put under `answer_contract.watch`) is judged against the
app's own OpenAPI document (tests/support/answer_contract.py); a test whose
answers broke it fails at teardown, each violation listed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from common.clock import ManualClock
from controlplane.app import create_app
from controlplane.auth import service as auth_service
from controlplane.auth.roles import Role
from controlplane.config import ControlPlaneSettings
from controlplane.db import build_engine, build_session_factory, session_scope
from controlplane.schema import upgrade
from controlplane.topology.lease import InMemoryLeaseReader
from tests.support.answer_contract import TALLY, AnswerContract
from tests.support.controlplane_testing import clean_tables, throwaway_database


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with throwaway_database(request.param, tmp_path_factory.mktemp("db")) as url:
        upgrade(url)
        yield url


@pytest.fixture(scope="session")
def db_engine(database_url: str) -> Iterator[Any]:
    engine = build_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def session_factory(db_engine: Any) -> Any:
    clean_tables(db_engine)
    return build_session_factory(db_engine)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def lease_reader() -> InMemoryLeaseReader:
    return InMemoryLeaseReader()


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> ControlPlaneSettings:
    return ControlPlaneSettings(database_url=database_url, data_dir=tmp_path, hash_workers=2,
                                artifact_roots=[tmp_path])


@pytest.fixture
def answer_contract() -> Iterator[AnswerContract]:
    """The document's judgement of the test's answers: the test fails at teardown when any broke it."""
    contract = AnswerContract()
    yield contract
    verdict = contract.verdict()
    if verdict is not None:
        pytest.fail(verdict, pytrace=False)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TALLY.answers:
        terminalreporter.write_line(f"answer contract: {TALLY.answers} answers judged against the OpenAPI "
                                    f"document, {TALLY.violations} violations")


@pytest.fixture
def client(
    settings: ControlPlaneSettings, session_factory: Any, clock: ManualClock, lease_reader: InMemoryLeaseReader,
    answer_contract: AnswerContract,
) -> Iterator[TestClient]:
    app = create_app(settings, clock=clock, lease_reader=lease_reader)
    with answer_contract.watch(TestClient(app, raise_server_exceptions=False)) as test_client:
        yield test_client


@pytest.fixture
def tokens(session_factory: Any, clock: ManualClock) -> dict[str, str]:
    """One token per human role (ids 1-3: viewer, operator, admin)."""
    secrets = {}
    with session_scope(session_factory) as session:
        for role in (Role.VIEWER, Role.OPERATOR, Role.ADMIN):
            _, secrets[role.value] = auth_service.create_token(
                session, name=f"test-{role.value}", role=role, created_by="test", clock=clock
            )
    return secrets


@pytest.fixture
def gateway_token(tokens: dict[str, str], session_factory: Any, clock: ManualClock) -> str:
    """A `gateway` role token, created after the human ones (id 4)."""
    with session_scope(session_factory) as session:
        _, secret = auth_service.create_token(session, name="test-gateway", role=Role.GATEWAY, created_by="test",
                                              clock=clock)
    return secret


@pytest.fixture
def as_role(tokens: dict[str, str], request: pytest.FixtureRequest) -> Any:
    def headers(role: str) -> dict[str, str]:
        secret = request.getfixturevalue("gateway_token") if role == "gateway" else tokens[role]
        return {"Authorization": f"Bearer {secret}"}

    return headers
