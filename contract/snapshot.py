"""The routing snapshot: desired state the control plane publishes and gateways and agents apply.

One model for producer (`controlplane/snapshot/service.py`) and consumers
(gateway, regional agent). The control plane labels each snapshot with a
version that only grows; consumers poll `GET /api/v1/snapshot` with
`If-None-Match: "snapshot-<epoch>-N"`, apply a new one atomically (a
request sees one snapshot, never half of one) and keep the last good one,
on disk, to serve from while the control plane is away (invariant 7). A
body that fails `RoutingSnapshot.model_validate` is refused and the old
snapshot stays.

The version only grows *within one control-plane database*: a fresh
database (a new demo, a rebuilt control plane) or a restore from backup
starts again lower. So each database has a `controlplane_epoch` (a random
id made when it is migrated, rotated by `lifeline controlplane epoch
rotate` after a restore), and versions are compared only within an epoch:
a snapshot from another epoch replaces the held one whatever its version
(`contract.snapshot_client.refusal`). The epoch is in the ETag too, so an
`If-None-Match` from one database never matches another's equal version.

`schema_version` changes only when a consumer built for an older schema
would misroute on the new one; fields a consumer does not know are ignored.

`replication_policies` carries each KV replication policy (per model and
session class, `controlplane/replication`) without its store URLs: a gateway
needs only when to checkpoint a session (`contract.session.checkpoint_due`)
and the declared RPO_context; the stores' credentials stay with the control
plane, and the KV goes to the store the region's engines were started with.
"""

from __future__ import annotations

from datetime import datetime
from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contract.canary import CanaryRecord
from contract.mesh import MeshRoute

SCHEMA_VERSION = 1


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class KnownIssueRef(_Record):
    id: int
    severity: str
    summary: str


class VersionEntry(_Record):
    """A weight version gateways may route to, and how to check its artifacts."""

    version: str
    fingerprint: str = Field(description="the catalog's semantic fingerprint (tokenizer, template, config)")
    location: str = Field(description="artifact location: a directory or s3://bucket/prefix")
    weights_digest: str | None = Field(None, description="contract.identity.weights_digest of the shards")
    files: dict[str, str] = Field(default_factory=dict, description="sha256 of each file a gateway loads")
    shards: dict[str, str] = Field(default_factory=dict, description="sha256 of every file the catalog recorded "
                                   "(weights, tokenizer, configs), by path under `location`: a regional agent "
                                   "checks a cold pool's staged copy by it (warm_pool/staging.py); empty from a "
                                   "control plane older than the field")
    known_issues: list[KnownIssueRef] = Field(default_factory=list)
    canary: CanaryRecord | None = Field(None, description="the version's recorded canary (contract.canary)")


class AliasEntry(_Record):
    version: str
    revision: int


class ModelEntry(_Record):
    aliases: dict[str, AliasEntry] = Field(default_factory=dict)
    versions: dict[str, VersionEntry] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _aliases_name_known_versions(self) -> ModelEntry:
        for name, alias in self.aliases.items():
            if alias.version not in self.versions:
                raise ValueError(f"alias {name!r} points to {alias.version!r}, which the snapshot does not describe")
        return self


class ClusterEntry(_Record):
    name: str
    region: str
    zone: str | None
    model: str
    endpoint: str
    weight: int = Field(ge=0)
    state: Literal["active", "draining", "ejected"]


class ReplicationPolicyEntry(_Record):
    """When a session of (model, session class) is checkpointed, and the RPO_context it declares."""

    model: str
    session_class: str
    mode: Literal["rebuildable", "interactive", "critical"]
    every_turns: int | None = Field(None, ge=1, description="interactive: a checkpoint every N turns")
    every_seconds: int | None = Field(None, ge=1, description="interactive: or once T seconds have passed")
    rpo_context_seconds: int = Field(ge=0, description="declared: context older than this is never lost")
    rpo_context_turns: int | None = Field(None, ge=0, description="declared: at most this many turns lost")
    revision: int = Field(ge=1)


class EjectionEntry(_Record):
    region: str
    instance_id: str
    generation: int | None
    reason: str


# A uuid in practice; restricted to what can sit inside a quoted ETag unescaped.
EPOCH_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$"


class RoutingSnapshot(_Record):
    schema_version: Literal[1] = SCHEMA_VERSION
    version: int = Field(ge=0)
    controlplane_epoch: str | None = Field(
        None, pattern=EPOCH_PATTERN,
        description="the control-plane database this snapshot came from; versions compare only within one "
                    "(None: a control plane from before epochs, one epoch of its own)")
    changed_at: datetime | None = None
    models: dict[str, ModelEntry] = Field(default_factory=dict)
    clusters: list[ClusterEntry] = Field(default_factory=list)
    # model → region → zone ("*" for a region-wide cluster) → summed weight of active clusters
    tier_weights: dict[str, dict[str, dict[str, int]]] = Field(default_factory=dict)
    drains: list[str] = Field(default_factory=list)
    ejected_clusters: list[str] = Field(default_factory=list)
    ejections: list[EjectionEntry] = Field(default_factory=list)
    # The mesh tier: version splits and header cohorts per model (contract.mesh); empty: no split.
    mesh_routes: list[MeshRoute] = Field(default_factory=list)
    # KV replication policies, one per (model, session class); none: no session is checkpointed.
    replication_policies: list[ReplicationPolicyEntry] = Field(default_factory=list)

    @property
    def etag(self) -> str:
        return etag_for(self.version, self.controlplane_epoch)

    def replication_policy(self, model: str, session_class: str) -> ReplicationPolicyEntry | None:
        return next((p for p in self.replication_policies
                     if p.model == model and p.session_class == session_class), None)

    def is_ejected(self, region: str, instance_id: str, generation: int | None) -> bool:
        """An ejection with no generation covers every generation of the instance."""
        ejected = self.ejected_keys
        return (region, instance_id, None) in ejected or (region, instance_id, generation) in ejected

    @cached_property
    def ejected_keys(self) -> frozenset[tuple[str, str, int | None]]:
        """Every (region, instance, generation) ejected, built once per snapshot.

        A gateway asks `is_ejected` for every lease of its region on every
        request; scanning the list made that leases × ejections (1.1 s a
        request at 3,333 of each, bench/fleet.py), a set keeps it one lookup.
        """
        return frozenset((e.region, e.instance_id, e.generation) for e in self.ejections)


def etag_for(version: int, epoch: str | None = None) -> str:
    """`"snapshot-<epoch>-<version>"`: two databases' equal versions never share a tag."""
    return f'"snapshot-{epoch}-{version}"' if epoch else f'"snapshot-{version}"'


def if_none_match_hits(header: str | None, etag: str) -> bool:
    """RFC 9110 §13.1.2 weak comparison: `*`, or any listed tag equal to `etag` ignoring `W/`."""
    if header is None:
        return False
    tags = [tag.strip() for tag in header.split(",")]
    if "*" in tags:
        return True
    bare = etag.removeprefix("W/")
    return any(tag.removeprefix("W/") == bare for tag in tags if tag)
