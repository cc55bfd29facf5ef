"""Cutover errors, each with its HTTP status and stable type.

    LifelineError
    ├── NotFound (404): cutover_not_found, zonal_shift_not_found
    ├── Conflict (409): invalid_transition, cutover_in_progress, gate_conflict, scope_busy,
    │                   safety_rule_violation, zonal_shift_active, zonal_shift_ended,
    │                   mesh_no_destination_left, mesh_unknown_destination
    ├── InvalidInput (422): invalid_request, tier_not_configured, nothing_to_cut_over,
    │                       invalid_expiry, break_glass_needs_reason, evidence_required
    └── Forbidden (403): break_glass_needs_admin

The mesh routes' own errors (mesh_route_conflict, mesh_route_in_use,
mesh_unknown_version) are controlplane/mesh_route/errors.py's.
"""

from __future__ import annotations

from typing import Any

from controlplane.errors import Conflict, Forbidden, InvalidInput, NotFound


class CutoverNotFound(NotFound):
    error_type = "cutover_not_found"


class ZonalShiftNotFound(NotFound):
    error_type = "zonal_shift_not_found"


class InvalidTransition(Conflict):
    """The state machine has no such edge from the cutover's current state."""

    error_type = "invalid_transition"


class CutoverInProgress(Conflict):
    """Another runner holds the cutover (its claim has not lapsed), or it changed under this one."""

    error_type = "cutover_in_progress"


class ScopeBusy(Conflict):
    """Another cutover of the same scope is executing, verifying or rolling back."""

    error_type = "scope_busy"


class SafetyRuleViolation(Conflict):
    """A safety rule refused the change; break-glass (admin + reason) overrides it."""

    error_type = "safety_rule_violation"

    def __init__(self, message: str, *, violations: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.violations = violations or []


class ZonalShiftActive(Conflict):
    error_type = "zonal_shift_active"


class ZonalShiftEnded(Conflict):
    error_type = "zonal_shift_ended"


class MeshNoDestinationLeft(Conflict):
    """Taking the scope's destinations out of a mesh route would leave it no weight anywhere."""

    error_type = "mesh_no_destination_left"


class EvidenceRequired(InvalidInput):
    """An automatic cutover must name the evidence that triggered it."""

    error_type = "evidence_required"


class TierNotConfigured(InvalidInput):
    error_type = "tier_not_configured"


class NothingToCutOver(InvalidInput):
    error_type = "nothing_to_cut_over"


class InvalidExpiry(InvalidInput):
    error_type = "invalid_expiry"


class BreakGlassNeedsReason(InvalidInput):
    error_type = "break_glass_needs_reason"


class BreakGlassNeedsAdmin(Forbidden):
    error_type = "break_glass_needs_admin"
