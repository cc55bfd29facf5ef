"""Drill definitions: the blast radius is enforced, faults fit their scope, cadence is due on virtual time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from common.clock import ManualClock
from controlplane.drill.errors import OutsideBlastRadius
from controlplane.drill.runner import check_blast_radius
from controlplane.drill.schemas import BlastRadius, DrillSpec
from controlplane.drill.service import is_due
from controlplane.drill.states import DrillScope


def spec(**overrides):
    body = {"name": "kill-one", "model": "tiny", "scope": "instance", "fault": "sigkill",
            "blast_radius": {"region": "local", "instances": ["victim"], "max_instances": 1}}
    return DrillSpec.model_validate({**body, **overrides})


def test_a_target_outside_the_blast_radius_is_refused():
    radius = BlastRadius(region="local", instances=["victim"], max_instances=1)
    check_blast_radius(radius, ["victim"])
    with pytest.raises(OutsideBlastRadius, match="survivor"):
        check_blast_radius(radius, ["survivor"])


def test_more_targets_than_the_cap_are_refused():
    radius = BlastRadius(region="local", instances=["a", "b"], max_instances=1)
    with pytest.raises(OutsideBlastRadius, match="cap of 1"):
        check_blast_radius(radius, ["a", "b"])


@pytest.mark.parametrize(("scope", "fault"), [("instance", "zone_loss"), ("region", "sigkill"),
                                              ("zone", "region_loss")])
def test_a_fault_must_fit_its_scope(scope, fault):
    with pytest.raises(ValidationError, match="is not a"):
        spec(scope=scope, fault=fault, blast_radius={"region": "r", "instances": ["x"], "zones": ["z"]})


def test_an_instance_drill_names_its_instances():
    with pytest.raises(ValidationError, match="names the instances"):
        spec(blast_radius={"region": "local"})


def test_unknown_fields_are_refused():
    with pytest.raises(ValidationError):
        spec(stop_conditions={"max_error_rat": 0.1})


@pytest.mark.parametrize(("scope", "period"), [(DrillScope.INSTANCE, timedelta(days=7)),
                                               (DrillScope.ZONE, timedelta(days=30)),
                                               (DrillScope.REGION, timedelta(days=91))])
def test_cadence_is_due_once_its_period_has_passed(scope, period):
    clock = ManualClock()
    last = clock.utcnow()
    assert is_due(scope=scope, last_run_at=None, now=clock.utcnow())
    clock.advance(period - timedelta(seconds=1))
    assert not is_due(scope=scope, last_run_at=last, now=clock.utcnow())
    clock.advance(timedelta(seconds=1))
    assert is_due(scope=scope, last_run_at=last, now=clock.utcnow())
