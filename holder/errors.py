"""Errors the holder answers with, in the one Lifeline shape (`common.errors`).

    HolderError (500 holder_error)
    ├── BadRequest (400 bad_request): a body that is not the documented JSON
    ├── UnknownTenant (404 unknown_tenant): heartbeat/confirm/release before attach
    ├── TenantSuperseded (409 tenant_superseded): a newer generation holds this tenant id
    ├── HolderNotReady (503 holder_not_ready): still replaying or loading
    ├── KVPoolAbsent (404 kv_pool_absent): started with --kv-blocks 0
    └── KVConflict (409 kv_conflict): a commit of a block not reserved, or out of chain order
"""

from __future__ import annotations

from common.errors import LifelineError
from contract.holder import NOT_READY_ERROR_TYPE, SUPERSEDED_ERROR_TYPE, UNKNOWN_TENANT_ERROR_TYPE


class HolderError(LifelineError):
    status_code = 500
    error_type = "holder_error"


class UnknownTenant(HolderError):
    status_code = 404
    error_type = UNKNOWN_TENANT_ERROR_TYPE


class TenantSuperseded(HolderError):
    status_code = 409
    error_type = SUPERSEDED_ERROR_TYPE


class HolderNotReady(HolderError):
    status_code = 503
    error_type = NOT_READY_ERROR_TYPE


class KVPoolAbsent(HolderError):
    status_code = 404
    error_type = "kv_pool_absent"


class KVConflict(HolderError):
    status_code = 409
    error_type = "kv_conflict"


class BadRequest(HolderError):
    status_code = 400
    error_type = "bad_request"
