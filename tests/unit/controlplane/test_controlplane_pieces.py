from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from controlplane.auth.roles import Role
from common.clock import ManualClock
from controlplane.config import ControlPlaneSettings
from contract.lease import Lease
from controlplane.topology.lease import InMemoryLeaseReader


def test_roles_are_ordered() -> None:
    assert Role.ADMIN.allows(Role.OPERATOR)
    assert Role.OPERATOR.allows(Role.VIEWER)
    assert not Role.VIEWER.allows(Role.OPERATOR)
    assert not Role.OPERATOR.allows(Role.ADMIN)


def test_bad_database_url_names_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_DATABASE_URL", "mysql://nope")
    with pytest.raises(ValidationError, match="LIFELINE_CONTROLPLANE_DATABASE_URL"):
        ControlPlaneSettings()


def test_default_database_is_sqlite_in_the_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("LIFELINE_CONTROLPLANE_DATABASE_URL", raising=False)
    settings = ControlPlaneSettings(data_dir=tmp_path)
    assert settings.resolved_database_url() == f"sqlite:///{tmp_path.resolve()}/controlplane.sqlite3"
    pg = ControlPlaneSettings(database_url="postgresql://u@h/db")
    assert pg.resolved_database_url() == "postgresql+psycopg://u@h/db"


def test_liveness_follows_the_clock_not_a_stored_flag() -> None:
    clock = ManualClock()
    lease = Lease("e1", 1, "http://e1", "v1", "z", "eu", expires_at=clock.wall() + 5)
    reader = InMemoryLeaseReader([lease])
    assert reader.list_instances("eu")[0].is_live(clock.wall())
    clock.advance(timedelta(seconds=5))
    assert not reader.list_instances("eu")[0].is_live(clock.wall())
    assert reader.list_instances("us") == []


def test_settings_read_only_their_own_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("LIFELINE_PORT", "9999")  # another process's bare prefix is not ours
    monkeypatch.setenv("LIFELINE_CONTROLPLANE_PORT", "8555")
    assert ControlPlaneSettings(data_dir=tmp_path).port == 8555


def test_gateway_role_is_outside_the_human_order() -> None:
    assert Role.GATEWAY.allows(Role.GATEWAY)
    assert not Role.GATEWAY.allows(Role.VIEWER)
    assert not Role.ADMIN.allows(Role.GATEWAY)
