"""Catalog errors, each with its HTTP status and stable type.

    LifelineError
    ├── NotFound: version_not_found, alias_not_found, issue_not_found
    ├── Conflict: version_exists, alias_conflict, alias_unchanged, fingerprint_mismatch,
    │             critical_known_issue, last_verify_failed, nothing_to_roll_back,
    │             issue_already_resolved, canary_exists,
    │             canary_engine_unverified, automatic_rollback_refused,
    │             no_canary_to_inherit
    ├── InvalidInput: invalid_artifact, invalid_location, force_needs_reason
    └── ArtifactStoreUnavailable (503): artifact_store_unavailable
"""

from __future__ import annotations

from controlplane.errors import Conflict, InvalidInput, LifelineError, NotFound


class VersionNotFound(NotFound):
    error_type = "version_not_found"


class AliasNotFound(NotFound):
    error_type = "alias_not_found"


class IssueNotFound(NotFound):
    error_type = "issue_not_found"


class VersionExists(Conflict):
    error_type = "version_exists"


class AliasConflict(Conflict):
    """The alias moved since the caller read it (compare-and-set lost)."""

    error_type = "alias_conflict"


class FingerprintMismatch(Conflict):
    error_type = "fingerprint_mismatch"


class CriticalKnownIssue(Conflict):
    error_type = "critical_known_issue"


class LastVerifyFailed(Conflict):
    """The version's last verify found corrupt or missing files or a drifted fingerprint."""

    error_type = "last_verify_failed"


class NothingToRollBack(Conflict):
    error_type = "nothing_to_roll_back"


class IssueAlreadyResolved(Conflict):
    error_type = "issue_already_resolved"


class CanaryExists(Conflict):
    """The version has a canary; replacing it must be asked for (`--replace`)."""

    error_type = "canary_exists"


class CanaryEngineUnverified(Conflict):
    """The engine a canary was recorded from is not a verified instance of the version."""

    error_type = "canary_engine_unverified"


class InvalidArtifact(InvalidInput):
    error_type = "invalid_artifact"


class InvalidLocation(InvalidInput):
    error_type = "invalid_location"


class ArtifactStoreUnavailable(LifelineError):
    """The store could not be reached (network, credentials); not the caller's fault."""

    status_code = 503
    error_type = "artifact_store_unavailable"


class AutomaticRollbackRefused(Conflict):
    """An automatic rollback was asked of an alias it never moves (`prod`: the pools' version, a cutover's call)."""

    error_type = "automatic_rollback_refused"


class NoCanaryToInherit(Conflict):
    """`canary inherit --from` names a version with no canary recorded."""

    error_type = "no_canary_to_inherit"
