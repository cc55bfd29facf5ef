"""The mesh tier in the gateway: a model's version split and cohorts, from the snapshot's mesh routes.

`contract.mesh` says what a route is. Here, for one region's gateway:

- `route(table, name, cohort, client_key)`: a client that names the model
  itself is sent to a version picked by the route of its cohort (or the
  default route) in proportion to the versions' weights — by the client
  key's hash when there is one, so a client stays on one version while the
  weights hold; at random otherwise. Versions whose artifacts did not
  verify are left out of the pick (their share goes to the others); with
  no route, or no weight left, the name resolves as before (alias `prod`).
  A region's own route for a cohort replaces the every-region one.
- `zone_excluded(...)`: a version's instances in a zone leave routing when
  the routes name that (version, zone) and every such destination has
  weight 0.

Pure functions over one snapshot: a request sees one snapshot's routes.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING

from contract.mesh import MeshRoute
from contract.snapshot import RoutingSnapshot
from gateway.routing_table import ModelVersion

if TYPE_CHECKING:
    from gateway.snapshot_table import SnapshotTable


def routes_for(snapshot: RoutingSnapshot, *, model: str, region: str) -> dict[str | None, MeshRoute]:
    """cohort → the route that applies in `region` (the region's own over an every-region one)."""
    chosen: dict[str | None, MeshRoute] = {}
    for route in snapshot.mesh_routes:
        if route.model != model or route.region not in (None, region):
            continue
        held = chosen.get(route.cohort)
        if held is None or (held.region is None and route.region is not None):
            chosen[route.cohort] = route
    return chosen


def pick_version(route: MeshRoute, *, allowed: Iterable[str], client_key: str | None,
                 rng: random.Random | None = None) -> str | None:
    """A version in proportion to its weight among `allowed`; None when none has weight."""
    permitted = set(allowed)
    weights = {v: w for v, w in sorted(route.version_weights().items()) if w > 0 and v in permitted}
    total = sum(weights.values())
    if total == 0:
        return None
    if client_key is not None:
        point = int.from_bytes(hashlib.sha256(f"{route.model}\0{client_key}".encode()).digest()[:8], "big") % total
    else:
        point = (rng or random).randrange(total)
    for version, weight in weights.items():
        if point < weight:
            return version
        point -= weight
    raise AssertionError("unreachable: point < total")  # pragma: no cover


def route(table: SnapshotTable, name: str, *, cohort: str | None, client_key: str | None,
          rng: random.Random | None = None) -> ModelVersion:
    """The version a request for `name` goes to under the mesh routes; `table.resolve(name)` without one."""
    snapshot = table.snapshot
    if snapshot is None or name not in snapshot.models or not snapshot.mesh_routes:
        return table.resolve(name)
    routes = routes_for(snapshot, model=name, region=table.region)
    chosen = routes.get(cohort) if cohort is not None else None
    chosen = chosen or routes.get(None)
    if chosen is None:
        return table.resolve(name)
    loaded = {mv.version: mv for mv in table.by_name.values()}
    version = pick_version(chosen, allowed=loaded, client_key=client_key, rng=rng)
    return loaded[version] if version is not None else table.resolve(name)


def zone_excluded(snapshot: RoutingSnapshot, *, region: str, model: str | None, version: str, zone: str) -> bool:
    """Whether the mesh routes take `version`'s instances in `zone` out (every naming destination at 0)."""
    if model is None or not snapshot.mesh_routes:
        return False
    named = [d.weight for r in routes_for(snapshot, model=model, region=region).values()
             for d in r.destinations if d.version == version and d.zone == zone]
    return bool(named) and not any(named)
