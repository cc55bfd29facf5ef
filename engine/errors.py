"""Errors the engine returns, in the OpenAI shape clients already parse:
`{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations


class EngineError(Exception):
    status_code = 500
    error_type = "InternalServerError"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.status_code,
            }
        }


class BadRequest(EngineError):
    status_code = 400
    error_type = "BadRequestError"


class NotReady(EngineError):
    status_code = 503
    error_type = "ServiceUnavailableError"


class InjectedFailure(EngineError):
    status_code = 500
    error_type = "InternalServerError"
