"""Token errors.

    NotFound: token_not_found
    Conflict: token_already_revoked, last_admin_token
"""

from __future__ import annotations

from controlplane.errors import Conflict, NotFound


class TokenNotFound(NotFound):
    error_type = "token_not_found"


class TokenAlreadyRevoked(Conflict):
    error_type = "token_already_revoked"


class LastAdminToken(Conflict):
    """Revoking it would leave no active admin token, so nobody could issue another over the API."""

    error_type = "last_admin_token"
