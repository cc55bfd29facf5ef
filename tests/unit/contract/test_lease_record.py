from __future__ import annotations

import pytest

from contract.lease import Lease, LeaseKeys


def test_lease_record_round_trips_through_its_json() -> None:
    lease = Lease("e1", 7, "http://e1:8000", "tiny-seed0", "eu-1a", "eu", expires_at=1_800_000_000.25)
    assert Lease.from_json(lease.to_json()) == lease


@pytest.mark.parametrize("raw", ["not json", "{}", '{"instance_id": "e1"}', "[]",
                                 '{"instance_id":"e","generation":"x","url":"u","version":"v","zone":"z","region":"r","expires_at":1}'])
def test_a_record_not_written_through_the_contract_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="not a lease record"):
        Lease.from_json(raw)


def test_key_layout_puts_the_region_in_every_key() -> None:
    keys = LeaseKeys("eu-west", "lifeline")
    assert keys.lease("e1") == "lifeline:eu-west:lease:e1"
    assert keys.generation("e1") == "lifeline:eu-west:gen:e1"
    assert keys.index == "lifeline:eu-west:instances"
