"""Mesh route errors, each with its HTTP status and stable type.

    LifelineError
    ├── NotFound (404): not_found (no such route)
    ├── Conflict (409): mesh_route_conflict, mesh_route_in_use
    └── InvalidInput (422): mesh_unknown_version
"""

from __future__ import annotations

from controlplane.errors import Conflict, InvalidInput


class MeshRouteConflict(Conflict):
    """A mesh route changed since the revision the writer read (`expected_revision`), or no longer exists."""

    error_type = "mesh_route_conflict"


class MeshRouteInUse(Conflict):
    """A cutover changed this mesh route and has not been rolled back: deleting it would leave nothing to restore."""

    error_type = "mesh_route_in_use"


class MeshUnknownVersion(InvalidInput):
    """A mesh route names a version no alias of the model points at: the snapshot could not describe it."""

    error_type = "mesh_unknown_version"
