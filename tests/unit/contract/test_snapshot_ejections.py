"""`RoutingSnapshot.is_ejected`: which leases an ejection covers (a set lookup, built once per snapshot)."""

from __future__ import annotations

import pytest

from contract.snapshot import EjectionEntry, RoutingSnapshot

SNAPSHOT = RoutingSnapshot(version=1, ejections=[
    EjectionEntry(region="r1", instance_id="every-generation", generation=None, reason="operator"),
    EjectionEntry(region="r1", instance_id="one-generation", generation=2, reason="agent"),
])


@pytest.mark.parametrize(("region", "instance_id", "generation", "ejected"), [
    ("r1", "every-generation", 7, True),
    ("r1", "every-generation", None, True),
    ("r1", "one-generation", 2, True),
    ("r1", "one-generation", 3, False),  # a restart under a new generation is routable again
    ("r1", "one-generation", None, False),
    ("r2", "every-generation", 7, False),  # ejections are per region
    ("r1", "never-ejected", 1, False),
])
def test_an_ejection_covers_its_generation_or_every_generation_when_it_names_none(
        region: str, instance_id: str, generation: int | None, ejected: bool) -> None:
    assert SNAPSHOT.is_ejected(region, instance_id, generation) is ejected


def test_the_ejection_index_is_not_part_of_the_snapshot_body() -> None:
    body = SNAPSHOT.model_dump(mode="json")
    assert "ejected_keys" not in body
    assert RoutingSnapshot.model_validate(body).is_ejected("r1", "one-generation", 2)
