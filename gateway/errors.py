"""Errors the gateway renders, one tree, one handler.

    GatewayError (500, internal_error)
    ├── BadRequest (400, invalid_request_error)     bad input; nothing changed
    ├── Unauthorized (401, authentication_error)    lease endpoint without the token
    ├── NotFound (404, not_found_error)
    ├── Overloaded (429, overloaded)                admission refused; carries Retry-After
    ├── NoHealthyEndpoint (503, no_healthy_endpoint)
    └── RecoveryImpossible (502, <reason>)          a stream that cannot continue

Rendered OpenAI-style, `{"error": {"message", "type", "param", "code"}}`, as a
JSON body before the first byte of a response and as an SSE `error` event after. Lease refusals (`stale_generation`,
`lease_expired`) are `contract.lease` errors, the same on every side.
"""

from __future__ import annotations

from common.errors import LifelineError


class GatewayError(LifelineError):
    status_code = 500
    error_type = "internal_error"


class BadRequest(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class Unauthorized(GatewayError):
    status_code = 401
    error_type = "authentication_error"


class NotFound(GatewayError):
    status_code = 404
    error_type = "not_found_error"


class Overloaded(GatewayError):
    status_code = 429
    error_type = "overloaded"


class NoHealthyEndpoint(GatewayError):
    status_code = 503
    error_type = "no_healthy_endpoint"


class RecoveryImpossible(GatewayError):
    """The stream cannot continue; `error_type` names why (documented in docs/gateway.md)."""

    status_code = 502

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, type=reason)
