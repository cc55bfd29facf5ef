"""Errors the gateway renders, one tree, one handler.

    GatewayError (500, internal_error)
    ├── BadRequest (400, invalid_request_error)     bad input; nothing changed
    ├── Unauthorized (401, authentication_error)    lease endpoint without the token
    ├── NotFound (404, not_found_error)
    ├── Overloaded (429, overloaded)                admission refused; carries Retry-After
    ├── NoHealthyEndpoint (503, no_healthy_endpoint)
    │   └── EngineIncompatible (502, engine_incompatible)  every engine left streams without token ids
    ├── PayloadTooLarge (413, request_too_large)    body over `max_body_bytes`
    ├── StreamCancelled (409, cancelled)            the last event of a cancelled stream
    ├── EnginePassthrough (<engine's 4xx>, <type>)  an engine's refusal of a first attempt, relayed
    └── RecoveryImpossible (502, <reason>)          a stream that cannot continue

Rendered OpenAI-style, `{"error": {"message", "type", "param", "code"}}`, as a
JSON body before the first byte of a response and as an SSE `error` event after. Lease refusals (`stale_generation`,
`lease_expired`) are `contract.lease` errors, the same on every side.
"""

from __future__ import annotations

from typing import Any

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


class EngineIncompatible(NoHealthyEndpoint):
    """The only engines there are cannot say what they committed (no `token_ids`; contract/engine_support.py)."""

    status_code = 502
    error_type = "engine_incompatible"


class RecoveryImpossible(GatewayError):
    """The stream cannot continue; `error_type` names why (documented in docs/gateway.md)."""

    status_code = 502

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, type=reason)


class PayloadTooLarge(GatewayError):
    status_code = 413
    error_type = "request_too_large"


class StreamCancelled(GatewayError):
    status_code = 409
    error_type = "cancelled"


class EnginePassthrough(GatewayError):
    """An engine's 4xx for the first attempt, relayed as is."""

    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(str(error.get("message", "engine rejected the request")), param=error.get("param"))
        self.status_code = status_code  # type: ignore[misc]
        self.error_type = str(error.get("type", "invalid_request_error"))
