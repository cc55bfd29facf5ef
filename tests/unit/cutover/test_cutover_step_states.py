"""Every step-state JSON earlier releases stored parses into its typed model and dumps back to the same bytes.

The examples are what the drivers wrote before states were typed (the
adapter's `model_dump` for a routing system, dict literals for the built-in
tiers), captured from that code; they go through the step columns' type
(`cutover.models.StepStateJSON`) as a row's JSON does, both ways.
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from sqlalchemy.dialects import postgresql, sqlite

from cutover.drivers.base import AnycastState, DnsState, L7State, MeshState
from cutover.drivers.step import (
    MeshRouteState,
    RecordedOnlyState,
    SnapshotClusterState,
    SnapshotInstanceState,
    describe_target,
)
from cutover.models import StepStateJSON
from cutover.scope import Scope, ScopeKind

DNS_TARGET = ('{"tier": "dns", "zone": "lifeline.test.", "name": "api.lifeline.test.", "rdtype": "A", '
              '"scope": {"kind": "region", "region": "eu", "name": "eu"}}')
DUAL_TARGET = ('{"tier": "dns", "zone": "lifeline.test.", "name": "api.lifeline.test.", "rdtype": "A", '
               '"internal_name": "api.internal.lifeline.test.", "scope": {"kind": "region", "region": "eu", '
               '"name": "eu"}}')
ANYCAST_TARGET = '{"tier": "anycast", "prefix": "203.0.113.10/32", "zone": "eu-a", "next_hop": "127.0.0.2"}'
L7_TARGET = '{"tier": "l7", "backend": "llm", "server": "s1"}'
MESH_TARGET = ('{"tier": "mesh", "namespace": "serving", "virtual_service": "llm", "route": "default", '
               '"destinations": ["llm.serving.svc.cluster.local/eu-a"]}')
CLUSTER_TARGET = '{"kind": "cluster", "cluster": "c-eu-a", "region": "eu"}'
INSTANCE_TARGET = '{"kind": "instance", "region": "eu", "instance_id": "engine-7", "generation": 3}'
ROUTE_TARGET = ('{"kind": "mesh_route", "model": "m", "route_region": "*", "cohort": "*", "zone": "eu-a", '
                '"region": "eu"}')
RECORDED_TARGET = '{"tier": "anycast", "recorded_only": true, "scope": "region:eu/zone:eu-a"}'

# (model, the JSON as stored, the step's driver_target label as the workflow wrote it)
STORED = [
    (DnsState, f'{{"tier": "dns", "target": {DNS_TARGET}, "values": ["192.0.2.10"], "ttl_s": 60}}',
     "name=api.lifeline.test.,rdtype=A,scope={'kind': 'region', 'region': 'eu', 'name': 'eu'},zone=lifeline.test."),
    (DnsState, f'{{"tier": "dns", "target": {DUAL_TARGET}, "values": ["198.51.100.10"], "ttl_s": 60, '
               '"internal_values": ["198.51.100.10"], "internal_ttl_s": 600}',
     "internal_name=api.internal.lifeline.test.,name=api.lifeline.test.,rdtype=A,"
     "scope={'kind': 'region', 'region': 'eu', 'name': 'eu'},zone=lifeline.test."),
    (DnsState, '{"tier": "dns", "target": {"tier": "dns", "zone": "lifeline.test.", "name": "api.lifeline.test.", '
               '"rdtype": "A"}, "values": [], "ttl_s": 0}',
     "name=api.lifeline.test.,rdtype=A,zone=lifeline.test."),
    (AnycastState, f'{{"tier": "anycast", "target": {ANYCAST_TARGET}, "announced": false}}',
     "next_hop=127.0.0.2,prefix=203.0.113.10/32,zone=eu-a"),
    (L7State, f'{{"tier": "l7", "target": {L7_TARGET}, "admin_state": "drain", "weight": 100}}',
     "backend=llm,server=s1"),
    (MeshState, f'{{"tier": "mesh", "target": {MESH_TARGET}, "weights": {{"llm.serving.svc.cluster.local/eu-b": 100, '
                '"llm.serving.svc.cluster.local/eu-a": 0}, "reconciled": true}',
     "destinations=['llm.serving.svc.cluster.local/eu-a'],namespace=serving,route=default,virtual_service=llm"),
    (SnapshotClusterState, f'{{"target": {CLUSTER_TARGET}, "state": "active", "weight": 100}}',
     "cluster=c-eu-a,kind=cluster,region=eu"),
    (SnapshotClusterState, f'{{"target": {CLUSTER_TARGET}, "state": "draining", "weight": 100}}',
     "cluster=c-eu-a,kind=cluster,region=eu"),
    (SnapshotClusterState, f'{{"target": {CLUSTER_TARGET}, "state": "ejected", "weight": 0}}',
     "cluster=c-eu-a,kind=cluster,region=eu"),
    (SnapshotClusterState, '{"target": {"kind": "cluster", "cluster": "gone", "region": "eu"}, "state": "absent", '
                           '"weight": 0}',
     "cluster=gone,kind=cluster,region=eu"),
    (SnapshotInstanceState, f'{{"target": {INSTANCE_TARGET}, "ejected": false}}',
     "generation=3,instance_id=engine-7,kind=instance,region=eu"),
    (SnapshotInstanceState, f'{{"target": {INSTANCE_TARGET}, "ejected": true}}',
     "generation=3,instance_id=engine-7,kind=instance,region=eu"),
    (MeshRouteState, f'{{"target": {ROUTE_TARGET}, "destinations": [{{"version": "v1", "zone": "eu-a", "weight": 0}}, '
                     '{"version": "v1", "zone": "eu-b", "weight": 98}, {"version": "v2", "zone": null, "weight": 2}]}',
     "cohort=*,kind=mesh_route,model=m,region=eu,route_region=*,zone=eu-a"),
    (MeshRouteState, f'{{"target": {ROUTE_TARGET}, "destinations": []}}',
     "cohort=*,kind=mesh_route,model=m,region=eu,route_region=*,zone=eu-a"),
    (RecordedOnlyState, f'{{"target": {RECORDED_TARGET}, "target_state": null}}',
     "recorded_only=True,scope=region:eu/zone:eu-a"),
    (RecordedOnlyState, f'{{"target": {RECORDED_TARGET}, "target_state": "out"}}',
     "recorded_only=True,scope=region:eu/zone:eu-a"),
]


@pytest.mark.parametrize("dialect", [sqlite.dialect(), postgresql.dialect()], ids=["sqlite", "postgresql"])
@pytest.mark.parametrize(("model", "stored", "label"), STORED, ids=[f"{m.__name__}-{i}" for i, (m, _, _) in
                                                                     enumerate(STORED)])
def test_a_stored_state_parses_into_its_model_and_dumps_back_byte_for_byte(
        model: type, stored: str, label: str, dialect: object) -> None:
    column = StepStateJSON()
    state = column.process_result_value(json.loads(stored), dialect)
    assert type(state) is model
    assert json.dumps(column.process_bind_param(state, dialect)) == stored
    assert describe_target(state.target) == label  # the step's driver_target, as it always read


def test_a_dns_targets_scope_is_the_cutovers_and_not_the_records() -> None:
    state = StepStateJSON().process_result_value(json.loads(STORED[0][1]), sqlite.dialect())
    assert isinstance(state, DnsState)
    assert state.target.scope == Scope(ScopeKind.REGION, "eu", "eu")
    assert state.target.record().model_dump(mode="json") == {
        "tier": "dns", "zone": "lifeline.test.", "name": "api.lifeline.test.", "rdtype": "A"}


def test_a_missing_state_is_null_both_ways() -> None:
    column = StepStateJSON()
    assert column.process_result_value(None, sqlite.dialect()) is None
    assert column.process_bind_param(None, sqlite.dialect()) is None


@pytest.mark.parametrize("stored", [
    {"target": {"kind": "router", "name": "r1"}, "state": "up"},  # no such shape
    {"target": {"kind": "cluster", "cluster": "c", "region": "eu"}, "state": "active"},  # its weight is missing
    {"target": {"kind": "cluster", "cluster": "c", "region": "eu"}, "state": "paused", "weight": 1},
    {"tier": "bgp", "target": {}, "announced": True},
    {"target": {"tier": "l7", "recorded_only": True, "scope": "region:eu"}, "target_state": "sideways"},
    {"tier": "anycast", "target": json.loads(ANYCAST_TARGET), "announced": True, "extra": 1},
    "not a state",
])
def test_a_state_of_no_known_shape_is_refused_on_load(stored: object) -> None:
    with pytest.raises(ValidationError):
        StepStateJSON().process_result_value(stored, sqlite.dialect())
