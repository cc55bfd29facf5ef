"""The pool driver's holder bookkeeping that needs no process: which engines are holder-backed, how many standbys.

The processes themselves (a standby becoming the restarted engine, the
refill, the tenancy released) are tests/e2e/holder/test_holder_pool_standby.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from warm_pool.driver import LocalDriver, holder_url, uses_holder


@pytest.mark.parametrize(("engine_args", "url"), [
    (["--holder", "http://127.0.0.1:8100"], "http://127.0.0.1:8100"),
    (["--dtype", "float32", "--holder=http://h:1"], "http://h:1"),
    (["--kv-cache-blocks", "8"], None),
    (["--holder"], None),  # a flag without its value names no holder (engine serve refuses it anyway)
    ([], None),
])
def test_a_holder_backed_engine_is_one_whose_flags_name_a_holder(engine_args, url):
    assert holder_url(engine_args) == url
    assert uses_holder(engine_args) is (url is not None)


def test_standbys_are_off_by_default_and_none_is_wanted_without_instances(tmp_path: Path):
    off = LocalDriver(region="r1", versions={"v": tmp_path}, state_dir=tmp_path, engine_args=["--holder", "http://h:1"])
    on = LocalDriver(region="r1", versions={"v": tmp_path}, state_dir=tmp_path, engine_args=["--holder", "http://h:1"],
                     standby=True)
    assert off.standby is False
    for driver in (off, on):
        asyncio.run(driver.refresh())
        assert driver.standbys_wanted() == 0 and driver.standbys == []


def test_the_agents_pool_setting_turns_standbys_on_for_the_local_driver_only(tmp_path: Path):
    from pydantic import ValidationError

    from warm_pool.driver import build_driver
    from warm_pool.settings import PoolSettings

    local = {"model": "m", "versions": {"v": str(tmp_path)}, "state_dir": str(tmp_path),
             "engine_args": ["--holder", "http://h:1"]}
    assert build_driver("r1", PoolSettings(**local)).standby is False
    assert build_driver("r1", PoolSettings(**local, standby=True)).standby is True
    with pytest.raises(ValidationError, match="pool.standby is for the local driver"):
        PoolSettings(model="m", versions={"v": "x"}, driver="kubernetes", standby=True,
                     kubernetes={"image": "lifeline:test", "namespace": "ns"})
