"""Parsing OpenAI-style JSON request bodies into pydantic models.

Shared by the engine and the gateway so both answer malformed JSON, a
non-object body and a failed field check the same way: one 400 whose
`param` names the first offending field.
"""

from __future__ import annotations

import json
from typing import Protocol, TypeVar

from pydantic import BaseModel, ValidationError

Body = TypeVar("Body", bound=BaseModel)


class BadRequestFactory(Protocol):
    def __call__(self, message: str, *, param: str | None = None) -> Exception: ...


def parse_json_body(raw: bytes, model: type[Body], bad_request: BadRequestFactory) -> Body:
    """Validate `raw` as `model`; raise `bad_request(message, param=...)` on any defect."""
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise bad_request("request body must be a JSON object")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise bad_request(f"{param}: {first['msg']}", param=param) from None
