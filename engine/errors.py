"""Errors the engine returns, in the OpenAI shape clients already parse:
`{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from common.errors import LifelineError


class EngineError(LifelineError):
    status_code = 500
    error_type = "InternalServerError"


class BadRequest(EngineError):
    status_code = 400
    error_type = "BadRequestError"


class NotReady(EngineError):
    status_code = 503
    error_type = "ServiceUnavailableError"


class InjectedFailure(EngineError):
    status_code = 500
    error_type = "InternalServerError"
