"""Drill errors, each with its HTTP status and stable type.

    LifelineError
    ├── NotFound (404): drill_not_found, drill_run_not_found
    ├── Conflict (409): invalid_transition, drill_run_changed, approval_required
    └── InvalidInput (422): outside_blast_radius, unsupported_drill
                            ├── region_tier_not_wired (an UnsupportedDrill)
                            └── fault_not_injectable (an UnsupportedDrill): stock vLLM has no fault hooks
"""

from __future__ import annotations

from controlplane.errors import Conflict, InvalidInput, NotFound


class DrillNotFound(NotFound):
    error_type = "drill_not_found"


class DrillRunNotFound(NotFound):
    error_type = "drill_run_not_found"


class InvalidTransition(Conflict):
    """The run's state machine has no such edge from its current state."""

    error_type = "invalid_transition"


class DrillRunChanged(Conflict):
    """Another actor changed the run between our read and our compare-and-set."""

    error_type = "drill_run_changed"


class ApprovalRequired(Conflict):
    """Zone and region drills start only after an operator approved the run."""

    error_type = "approval_required"


class OutsideBlastRadius(InvalidInput):
    """The fault target is not named by the drill's blast radius, or the cap would be exceeded."""

    error_type = "outside_blast_radius"


class UnsupportedDrill(InvalidInput):
    """No runner exists for this scope and fault (yet); the run is refused rather than faked."""

    error_type = "unsupported_drill"


class RegionTierNotWired(UnsupportedDrill):
    """A region drill on a fleet with no second region or no DNS tier: there is nowhere to fail over to."""

    error_type = "region_tier_not_wired"


class FaultNotInjectable(UnsupportedDrill):
    """The fault needs a hook the target engine does not have (stock vLLM: no fault admin), so it is refused
    before anything is touched rather than faked."""

    error_type = "fault_not_injectable"
