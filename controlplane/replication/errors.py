"""Replication errors, each with its HTTP status and stable type.

    LifelineError
    ├── NotFound (404): replication_policy_not_found
    └── Conflict (409): replication_policy_conflict (a compare-and-set on revision lost)

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

