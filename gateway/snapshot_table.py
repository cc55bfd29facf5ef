"""The routing table a control-plane snapshot describes, for one region's gateway.

`SnapshotTable` is immutable and built whole from one `RoutingSnapshot`
plus the verified artifacts of its versions; `SnapshotRouting` holds the
current one and swaps it with a single reference assignment. Every read
(`resolve`, `versions`, the lease filter) takes `self.table` once, so it
sees one snapshot, never half of one. A request resolves its version from
the snapshot current when it arrives; the endpoint filter reads the newest
one, so an ejection applied mid-request is honoured at once.

Client model names, for a catalog model `tiny` with aliases and versions:

    tiny           → alias `prod` of tiny
    tiny:canary    → alias `canary` of tiny (any alias: `<model>:<alias>`)
    tiny-seed1     → that version itself, if the snapshot describes it

What the snapshot removes from routing, for this gateway's region:

- an instance the snapshot ejects (`RoutingSnapshot.is_ejected`, one
  generation or all of them);
- every instance in a zone whose tier weight for the model is 0 — the
  zone's clusters are draining or ejected (`tier_weights` sums only active
  clusters; a region-wide cluster is zone `*`). A zone the snapshot does
  not mention for the region is not constrained (fail open: the control
  plane declares what to drain, it does not enumerate what may serve).
- a version's instances in a zone whose mesh-route weight is 0 (the mesh
  tier: `gateway/mesh.py`, which also splits a bare model name across
  versions and header cohorts for new requests, `SnapshotRouting.route`).

Non-zero weights are not yet turned into traffic shares: within the zones
that may serve, the router balances by load (`gateway/router.py`).
A version whose artifacts failed verification is left out: resolving a
name that maps to it is a 503 `version_unverified`, never a misuse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING

from tokenizers import Tokenizer

from contract.lease import Lease
from contract.snapshot import RoutingSnapshot
from gateway import mesh
from gateway.artifacts import LoadedArtifacts
from gateway.errors import BadRequest, NoHealthyEndpoint
from gateway.routing_table import DeclaredEngine, ModelVersion

if TYPE_CHECKING:
    from gateway.router import LeaseView

PROD_ALIAS = "prod"
_RETRY_AFTER_S = 1.0


@dataclass(frozen=True)
class SnapshotModelVersion(ModelVersion):
    """A ModelVersion whose tokenizer, template and length were read from verified bytes."""

    artifacts: LoadedArtifacts | None = field(default=None, compare=False, repr=False)

    @property
    def tokenizer(self) -> Tokenizer:  # type: ignore[override]
        assert self.artifacts is not None  # built only with artifacts
        return self.artifacts.tokenizer

    @property
    def chat_template(self) -> str | None:  # type: ignore[override]
        return self.artifacts.chat_template if self.artifacts else None

    @property
    def max_model_len(self) -> int:  # type: ignore[override]
        assert self.artifacts is not None
        return self.artifacts.max_model_len


@dataclass(frozen=True)
class SnapshotTable:
    region: str
    snapshot: RoutingSnapshot | None
    applied_at: datetime | None
    by_name: Mapping[str, SnapshotModelVersion]
    listed: tuple[SnapshotModelVersion, ...]
    unverified: Mapping[str, str]  # version → why it is not routed to
    unverified_names: Mapping[str, str]  # client name → its unverified version
    model_of_version: Mapping[str, str]

    @classmethod
    def empty(cls, region: str) -> SnapshotTable:
        return cls(region, None, None, MappingProxyType({}), (), MappingProxyType({}), MappingProxyType({}),
                   MappingProxyType({}))

    @classmethod
    def build(cls, snapshot: RoutingSnapshot, *, region: str, artifacts: Mapping[str, LoadedArtifacts],
              unverified: Mapping[str, str], applied_at: datetime) -> SnapshotTable:
        by_name: dict[str, SnapshotModelVersion] = {}
        listed: list[SnapshotModelVersion] = []
        unverified_names: dict[str, str] = {}
        model_of_version: dict[str, str] = {}

        def add(name: str, version: str, listed_here: bool) -> None:
            loaded = artifacts.get(version)
            if loaded is None:
                unverified_names[name] = version
                return
            mv = SnapshotModelVersion(name, version, loaded.model_dir, None, loaded)
            by_name[name] = mv
            if listed_here:
                listed.append(mv)

        for model_name, model in sorted(snapshot.models.items()):
            for version in model.versions:
                model_of_version[version] = model_name
            for alias_name, alias in sorted(model.aliases.items()):
                if alias_name == PROD_ALIAS:
                    add(model_name, alias.version, True)
                add(f"{model_name}:{alias_name}", alias.version, alias_name != PROD_ALIAS)
            for version in sorted(model.versions):
                if version not in by_name and version not in unverified_names:
                    add(version, version, False)
        return cls(region, snapshot, applied_at, MappingProxyType(by_name), tuple(listed),
                   MappingProxyType(dict(unverified)), MappingProxyType(unverified_names),
                   MappingProxyType(model_of_version))

    @property
    def version(self) -> int | None:
        return self.snapshot.version if self.snapshot else None

    @property
    def epoch(self) -> str | None:
        """The control-plane epoch `version` counts in (`RoutingSnapshot.controlplane_epoch`)."""
        return self.snapshot.controlplane_epoch if self.snapshot else None

    # -- the RoutingTable protocol ---------------------------------------------------
    def resolve(self, name: str) -> ModelVersion:
        found = self.by_name.get(name)
        if found is not None:
            return found
        if self.snapshot is None:
            raise NoHealthyEndpoint("this gateway has no routing snapshot yet (control plane unreachable and no "
                                    "snapshot on disk)", type="no_routing_snapshot", retry_after_s=_RETRY_AFTER_S)
        if name in self.unverified_names:
            version = self.unverified_names[name]
            raise NoHealthyEndpoint(f"model {name!r} maps to version {version!r}, whose artifacts failed "
                                    f"verification: {self.unverified.get(version, 'unknown')}",
                                    type="version_unverified", retry_after_s=_RETRY_AFTER_S)
        known = sorted(v.alias for v in self.listed)
        raise BadRequest(f"model {name!r} does not exist; known models: {known}", param="model")

    def versions(self) -> list[ModelVersion]:
        return list(self.listed)

    def declared_engines(self, version: str) -> list[DeclaredEngine]:
        # Instances come from leases; a snapshot cluster is a whole cluster, not an engine of one version.
        return []

    # -- what the snapshot removes -----------------------------------------------------
    def admits(self, lease: Lease) -> bool:
        snapshot = self.snapshot
        if snapshot is None:
            return True
        if snapshot.is_ejected(self.region, lease.instance_id, lease.generation):
            return False
        model = self.model_of_version.get(lease.version)
        if mesh.zone_excluded(snapshot, region=self.region, model=model, version=lease.version, zone=lease.zone):
            return False  # the mesh tier took this version's share in the zone to zero (gateway/mesh.py)
        by_region = snapshot.tier_weights.get(model or "", {}).get(self.region)
        if not by_region or (lease.zone not in by_region and "*" not in by_region):
            return True
        return by_region.get(lease.zone, 0) + by_region.get("*", 0) > 0


class SnapshotRouting:
    """The current SnapshotTable, swapped whole; implements the RoutingTable protocol."""

    def __init__(self, region: str) -> None:
        self.table = SnapshotTable.empty(region)

    def apply(self, table: SnapshotTable) -> None:
        self.table = table  # one reference assignment: readers see the old table or the new, never a mix

    def resolve(self, name: str) -> ModelVersion:
        return self.table.resolve(name)

    def route(self, name: str, *, cohort: str | None, client_key: str | None) -> ModelVersion:
        """A new request's version: the mesh tier's split of a bare model name (gateway/mesh.py)."""
        return mesh.route(self.table, name, cohort=cohort, client_key=client_key)

    def versions(self) -> list[ModelVersion]:
        return self.table.versions()

    def declared_engines(self, version: str) -> list[DeclaredEngine]:
        return self.table.declared_engines(version)


class SnapshotLeaseView:
    """A LeaseView that leaves out what the current snapshot ejects or drains; same interface.

    The filtered list is kept until the leases or the table change (both are
    replaced whole, never changed in place), so a request reads it instead of
    filtering a region's every lease again (3,334 of them: most of a 12 ms
    pick, bench/fleet.py).
    """

    def __init__(self, inner: LeaseView, routing: SnapshotRouting) -> None:
        self.inner = inner
        self.routing = routing
        self.registry = inner.registry
        self._admitted: tuple[list[Lease], SnapshotTable, list[Lease]] | None = None

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        await self.inner.stop()

    async def current(self) -> list[Lease]:
        leases, table = await self.inner.current(), self.routing.table
        held = self._admitted
        if held is None or held[0] is not leases or held[1] is not table:
            held = self._admitted = (leases, table, [lease for lease in leases if table.admits(lease)])
        return held[2]

    async def all_live(self) -> list[Lease]:
        return await self.inner.current()
