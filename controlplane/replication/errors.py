"""Replication errors, each with its HTTP status and stable type.

    LifelineError
    ├── NotFound (404): replication_policy_not_found
    │                   replication_dead_letter_not_found (a named key is no dead letter of the policy)
    └── Conflict (409): replication_policy_conflict (a compare-and-set on revision lost)
                        replication_dead_letter_conflict (a dead letter changed state meanwhile)
                        replication_dead_letter_invalid_transition (states.TRANSITIONS refuses it)

A store URL that `contract.kv_checkpoint.check_kv_store_url` refuses is a
validation error of the request body (422 `invalid_request`), echoed redacted.
"""

from __future__ import annotations

from controlplane.errors import Conflict, NotFound


class ReplicationPolicyNotFound(NotFound):
    error_type = "replication_policy_not_found"


class ReplicationPolicyConflict(Conflict):
    """The policy is at another revision than the caller's `expected_revision`: read it again."""

    error_type = "replication_policy_conflict"



class ReplicationDeadLetterNotFound(NotFound):
    error_type = "replication_dead_letter_not_found"


class ReplicationDeadLetterConflict(Conflict):
    """A dead letter changed state between the read and the compare-and-set: read it again."""

    error_type = "replication_dead_letter_conflict"


class InvalidDeadLetterTransition(Conflict):
    error_type = "replication_dead_letter_invalid_transition"
