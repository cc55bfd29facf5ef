"""Parsing OpenAI-style JSON request bodies into pydantic models.

Shared by the engine and the gateway so both answer malformed JSON, a
non-object body and a failed field check the same way: one 400 whose
`param` names the first offending field. Two defects that used to escape as
500s are refused here too:

- JSON nested deeper than the interpreter's recursion limit (the C decoder
  raises `RecursionError`);
- a string holding a lone UTF-16 surrogate (`"\\ud800"`, or its raw bytes,
  which `json.loads` lets through): it has no UTF-8 form, so a tokenizer, a
  log line or a forwarded body would fail on it later. `param` names the
  string's path (`prompt`, `messages.0.content`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

Body = TypeVar("Body", bound=BaseModel)

# Where a lone surrogate could hide: a \uD800-\uDFFF escape or its raw (surrogatepass) UTF-8 bytes.
# Only bodies that match are walked, so an ordinary body costs one regex scan.
_MAYBE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


class BadRequestFactory(Protocol):
    def __call__(self, message: str, *, param: str | None = None) -> Exception: ...


def parse_json_body(raw: bytes, model: type[Body], bad_request: BadRequestFactory) -> Body:
    """Validate `raw` as `model`; raise `bad_request(message, param=...)` on any defect."""
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request("request body is nested too deeply") from None
    if not isinstance(payload, dict):
        raise bad_request("request body must be a JSON object")
    if _MAYBE_SURROGATE.search(raw) and (path := _lone_surrogate_path(payload)) is not None:
        raise bad_request(f"{path or 'body'}: text holds a lone UTF-16 surrogate, which is not valid Unicode text",
                          param=path or None)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise bad_request(f"{param}: {first['msg']}", param=param) from None
    except RecursionError:
        raise bad_request("request body is nested too deeply") from None


def _lone_surrogate_path(payload: Any) -> str | None:
    """The dotted path of the first string (or key) holding a lone surrogate; iterative, so depth costs nothing."""
    stack: list[tuple[str, Any]] = [("", payload)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if not _is_utf8(value):
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{key}" if path else str(key)
                if not _is_utf8(key):
                    return child
                stack.append((child, item))
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(value))
    return None


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
