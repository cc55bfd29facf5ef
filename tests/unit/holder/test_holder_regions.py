"""Replay is a pure function of the records: regions, allocation order, tenants."""

from __future__ import annotations

import pytest

from contract.holder import TenantState
from holder.regions import RegionStatus, rebuild


def reserve(region: int) -> dict:
    return {"op": "reserve", "region": region, "path": f"/dev/shm/t/region-{region:06d}.bin", "size": 64,
            "purpose": "weights", "owner": "holder", "tensors": [], "meta": {"k": region}}


def seal(region: int, epoch: int = 1) -> dict:
    return {"op": "seal", "region": region, "checksum": f"sha256:{region}", "epoch": epoch}


def test_regions_replay_in_allocation_order_with_their_status():
    state = rebuild([{"op": "boot", "epoch": 1}, reserve(1), seal(1), reserve(2), reserve(3), seal(3),
                     {"op": "free", "region": 1, "reason": "x"}, {"op": "boot", "epoch": 2}])
    assert list(state.regions) == [1, 2, 3]
    assert [state.regions[i].status for i in (1, 2, 3)] == [RegionStatus.FREED, RegionStatus.RESERVED,
                                                            RegionStatus.SEALED]
    assert [r.region_id for r in state.live_regions()] == [2, 3]
    assert state.boots == 2
    assert state.next_region_id == 4  # a freed id is never handed out again
    assert state.anomalies == []


@pytest.mark.parametrize("records, anomaly", [
    ([seal(1)], "seal of region 1 that is not reserved"),
    ([reserve(1), seal(1), seal(1)], "seal of region 1 that is not reserved"),
    ([reserve(2), reserve(1)], "region 1 reserved twice or out of order"),
    ([reserve(1), {"op": "free", "region": 1}, {"op": "free", "region": 1}], "free of region 1 that is not live"),
    ([{"op": "defragment"}], "unknown op 'defragment'"),
])
def test_records_that_do_not_fit_are_anomalies_and_change_nothing(records, anomaly):
    state = rebuild(records)
    assert anomaly in state.anomalies


def test_a_newer_generation_takes_over_until_it_confirms():
    attach = {"op": "attach", "tenant": "engine-a", "generation": 1}
    state = rebuild([attach, {**attach, "generation": 2}])
    tenant = state.tenants["engine-a"]
    assert (tenant.generation, tenant.state, tenant.takeovers) == (2, TenantState.TAKING_OVER, 1)
    state.apply({"op": "confirm", "tenant": "engine-a", "generation": 1})  # the old one cannot confirm
    assert tenant.state is TenantState.TAKING_OVER
    state.apply({"op": "confirm", "tenant": "engine-a", "generation": 2})
    assert tenant.state is TenantState.ATTACHED
    state.apply({"op": "attach", "tenant": "engine-a", "generation": 1})
    assert tenant.generation == 2
    assert "attach of engine-a at stale generation 1" in state.anomalies


def test_a_released_tenant_attaches_fresh_and_keeps_its_takeover_count():
    state = rebuild([{"op": "attach", "tenant": "e", "generation": 1}, {"op": "attach", "tenant": "e", "generation": 2},
                     {"op": "release", "tenant": "e", "generation": 2}])
    assert state.tenants["e"].state is TenantState.RELEASED
    state.apply({"op": "attach", "tenant": "e", "generation": 3})
    assert (state.tenants["e"].state, state.tenants["e"].takeovers) == (TenantState.ATTACHED, 1)
