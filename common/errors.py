"""One error base for every Lifeline process, rendered one way.

    LifelineError (status_code, error_type)
    ├── gateway.errors.GatewayError tree      OpenAI-style types clients parse
    ├── engine.errors.EngineError tree        vLLM's type names, for compatibility
    ├── contract.lease.LeaseError tree        lease refusals, the same on every side
    └── controlplane.errors tree              admin API types (docs/controlplane.md)

Every process renders an error as

    {"error": {"message": ..., "type": ..., "param": ..., "code": <status>}}

as a JSON body before the first byte of a response, and as an SSE `error`
event with the same shape after it. `error_type` is stable: clients branch on
it; the message is for people.
"""

from __future__ import annotations

from typing import Any, ClassVar


class LifelineError(Exception):
    status_code: ClassVar[int] = 500
    error_type: str = "internal_error"

    def __init__(self, message: str, *, type: str | None = None, param: str | None = None,  # noqa: A002
                 retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        if type is not None:
            self.error_type = type
        self.param = param
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return error_body(self.error_type, self.message, param=self.param, code=self.status_code)

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


def error_body(error_type: str, message: str, *, param: str | None = None, code: int | None = None) -> dict[str, Any]:
    """The one error shape, for errors that are not exceptions (a framework's 404, a validation error)."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
