"""Errors the gateway renders, one tree, one handler.

    GatewayError (500, internal_error)
    ├── BadRequest (400, invalid_request_error)     bad input; nothing changed
    ├── Unauthorized (401, authentication_error)    lease endpoint without the token
    ├── NotFound (404, not_found_error)
    ├── StaleGeneration (409, stale_generation)     a renewal or frame from an older generation
    ├── LeaseExpired (404, lease_expired)           renew after the lease lapsed: re-register
    ├── Overloaded (429, overloaded)                admission refused; carries Retry-After
    ├── NoHealthyEndpoint (503, no_healthy_endpoint)
    └── RecoveryImpossible (502, <reason>)          a stream that cannot continue

Rendered OpenAI-style, `{"error": {"message", "type", "param", "code"}}`, as a
JSON body before the first byte of a response and as an SSE `error` event after.
"""

from __future__ import annotations


class GatewayError(Exception):
    status_code = 500
    error_type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.status_code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


class BadRequest(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class Unauthorized(GatewayError):
    status_code = 401
    error_type = "authentication_error"


class NotFound(GatewayError):
    status_code = 404
    error_type = "not_found_error"


class StaleGeneration(GatewayError):
    status_code = 409
    error_type = "stale_generation"


class LeaseExpired(GatewayError):
    status_code = 404
    error_type = "lease_expired"


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
        super().__init__(message)
        self.error_type = reason
