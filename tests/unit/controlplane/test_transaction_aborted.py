"""A transaction the database aborted (deadlock, serialization failure) is a 409, not a database outage."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from controlplane.errors import install_error_handlers


class DriverError(Exception):
    def __init__(self, sqlstate: str | None) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


def app_raising(sqlstate: str | None) -> TestClient:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/move")
    def move() -> None:
        raise OperationalError("UPDATE aliases …", {}, DriverError(sqlstate))

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])
def test_a_deadlock_or_serialization_abort_is_409_transaction_aborted(sqlstate: str) -> None:
    response = app_raising(sqlstate).post("/move")
    assert response.status_code == 409
    assert response.json()["error"]["type"] == "transaction_aborted"
    assert "retry-after" not in response.headers


@pytest.mark.parametrize("sqlstate", [None, "08006", "57014", "53300"])
def test_a_database_that_is_away_stays_503_database_unavailable(sqlstate: str | None) -> None:
    response = app_raising(sqlstate).post("/move")
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "database_unavailable"
    assert response.headers["retry-after"] == "1"
