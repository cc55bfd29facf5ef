from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from controlplane.auth.roles import Role
from controlplane.clock import ManualClock
from controlplane.config import ControlPlaneSettings
from controlplane.topology.lease import InMemoryLeaseReader, ObservedInstance, lease_key, parse_instance

pytestmark = pytest.mark.unit


def test_roles_are_ordered() -> None:
    assert Role.ADMIN.allows(Role.OPERATOR)
    assert Role.OPERATOR.allows(Role.VIEWER)
    assert not Role.VIEWER.allows(Role.OPERATOR)
    assert not Role.OPERATOR.allows(Role.ADMIN)


def test_bad_database_url_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIFELINE_DATABASE_URL", "mysql://nope")
    with pytest.raises(ValidationError, match="LIFELINE_DATABASE_URL"):
        ControlPlaneSettings()


def test_default_database_is_sqlite_in_the_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("LIFELINE_DATABASE_URL", raising=False)
    settings = ControlPlaneSettings(data_dir=tmp_path)
    assert settings.resolved_database_url() == f"sqlite:///{tmp_path.resolve()}/controlplane.sqlite3"
    pg = ControlPlaneSettings(database_url="postgresql://u@h/db")
    assert pg.resolved_database_url() == "postgresql+psycopg://u@h/db"


def test_lease_record_parses_iso_and_unix_expiry() -> None:
    base = {"instance_id": "e1", "generation": "7", "endpoint": "http://e1", "zone": "z", "state": "ready"}
    iso = parse_instance({**base, "lease_expires_at": "2026-01-01T00:00:10+00:00"})
    unix = parse_instance({**base, "lease_expires_at": str(datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC).timestamp())})
    assert iso == unix
    assert iso.generation == 7
    with pytest.raises(ValueError, match="offset"):
        parse_instance({**base, "lease_expires_at": "2026-01-01T00:00:10"})
    assert lease_key("eu", "e1") == "lifeline:lease:eu:e1"


def test_liveness_follows_the_clock_not_a_stored_flag() -> None:
    clock = ManualClock()
    instance = ObservedInstance("e1", 1, "http://e1", None, "ready", clock.now() + timedelta(seconds=5))
    reader = InMemoryLeaseReader([("eu", instance)])
    assert reader.list_instances("eu")[0].is_live(clock.now())
    clock.advance(timedelta(seconds=5))
    assert not reader.list_instances("eu")[0].is_live(clock.now())
    assert reader.list_instances("us") == []
