"""bench/cutover.py's table: the seed's band is judged on p99 plus what clients may still cache (no timing here)."""

from __future__ import annotations

from bench.cutover import EU, ZONE_A, Row, report
from contract.routing_tier import RoutingTier


def _row(tier: RoutingTier, seconds: float, ttl: int | None = None) -> Row:
    return Row(tier, f"{tier.value} system", EU if tier == RoutingTier.DNS else ZONE_A, [seconds] * 20,
               [seconds / 10] * 20, [seconds / 2] * 20, ttl)


def test_the_table_judges_each_tier_by_its_band_and_adds_the_dns_ttl() -> None:
    table = report(20, [_row(RoutingTier.L7, 0.05), _row(RoutingTier.MESH, 1.5),
                        _row(RoutingTier.DNS, 0.1, ttl=60), _row(RoutingTier.DNS, 0.1, ttl=600)])
    rows = [line for line in table.splitlines() if line.startswith("| ") and " system | 20 |" in line]
    assert [r.split(" | ")[-1] for r in rows] == ["yes |", "no |", "yes |", "no |"]
    assert "| 60.1 s |" in rows[2] and "| 600.1 s |" in rows[3]
    assert "| 50.0 | 50.0 |" in rows[0]  # cutover p50 and p99 in ms


def test_the_zonal_shift_row_names_its_three_tiers_and_is_judged_by_the_slowest_band() -> None:
    from bench.cutover import ZONAL_SHIFT_SYSTEM

    shift = Row(RoutingTier.ANYCAST, ZONAL_SHIFT_SYSTEM, ZONE_A, [2.0] * 20, [0.01] * 20, [1.0] * 20, None)
    (row,) = [line for line in report(20, [shift]).splitlines() if ZONAL_SHIFT_SYSTEM in line]
    assert row.startswith("| l7 → mesh → anycast | ")
    assert row.endswith("| seconds | yes |")  # 2 s is beyond l7's and mesh's bands, inside anycast's
