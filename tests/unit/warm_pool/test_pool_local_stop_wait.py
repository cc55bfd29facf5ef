"""The local driver waits out an engine's whole SIGTERM drain before it SIGKILLs."""

from __future__ import annotations

from engine import drain
from engine.settings import EngineSettings
from warm_pool.driver import ENGINE_DRAIN_S, LocalDriver


def test_the_default_stop_wait_covers_the_engines_default_drain(tmp_path) -> None:
    fields = EngineSettings.model_fields
    drain_s = (fields["drain_unroute_wait"].default.total_seconds() + fields["drain_timeout"].default.total_seconds()
               + drain._FLUSH_S)
    driver = LocalDriver(region="eu", versions={}, state_dir=tmp_path)
    assert driver.stop_timeout == ENGINE_DRAIN_S
    assert driver.stop_timeout > drain_s  # else a straggler is SIGKILLed instead of ending with engine_draining
