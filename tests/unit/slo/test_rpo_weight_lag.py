"""RPO_weight from the alias history and what each region serves: a pure table (no I/O)."""

from __future__ import annotations

import re

import pytest

from controlplane.slo.rpo_weight import RegionServing, lag_versions, measure


@pytest.mark.parametrize(("history", "served", "lag"), [
    (["v1", "v2", "v3"], {"v3"}, 0),
    (["v1", "v2", "v3"], {"v2"}, 1),
    (["v1", "v2", "v3"], {"v1"}, 2),
    (["v1", "v2", "v3", "v2"], {"v2"}, 0),  # rolled back to what the region serves
    (["v1", "v2", "v3", "v2"], {"v1"}, 2),  # v2 and v3, each counted once
    (["v1", "v2", "v3"], {"v1", "v3"}, 0),  # mid-rollout: it serves the current one too
    (["v1", "v2"], {"v9"}, None),  # serves nothing the alias ever named
    ([], {"v1"}, None),
])
def test_lag_is_the_distinct_versions_named_since_the_one_served(history, served, lag) -> None:
    assert lag_versions(history, served) == lag


def serving(region: str, *versions: str, source: str = "gateway gw") -> RegionServing:
    return RegionServing(region, set(versions), [source])


def test_the_figure_is_the_worst_region_and_names_its_evidence() -> None:
    figure = measure(["v1", "v2", "v3"], {"eu": serving("eu", "v3"), "us": serving("us", "v2", source="agent a-1")})
    assert (figure.value, figure.per_region) == (1, {"eu": 0, "us": 1})
    assert "us: 1 behind (agent a-1)" in figure.why


@pytest.mark.parametrize(("history", "regions", "why"), [
    ([], {"eu": serving("eu", "v1"), "us": serving("us", "v1")}, "no prod alias history"),
    (["v1"], {"eu": serving("eu", "v1"), "us": None}, r"no fresh gateway or agent report from region\(s\) \['us'\]"),
    (["v1"], {"eu": serving("eu", "v1")}, "no standby"),
    (["v1"], {"eu": serving("eu", "v1"), "us": serving("us", "v7")}, "serve no version the prod alias has named"),
])
def test_no_figure_without_evidence(history, regions, why) -> None:
    figure = measure(history, regions)
    assert figure.value is None
    assert re.search(why, figure.why), figure.why
